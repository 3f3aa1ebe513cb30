//! `GET /api/v1/openapi.json`: the status API described as OpenAPI 3.1, its schemas generated
//! from the very types the handlers serialize, so the document cannot drift from the code.

use murmur_core::contract::{JoinReport, PeerEvent, TopologyDocument, TrainerStatus};
use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use super::view::{JobEvent, JobSummary, JobView, SeriesPoint};

/// A paced observer read's answers (see `pacer`).
fn ok(schema: Value, description: &str) -> Value {
    json!({"200": {"description": description, "content": {"application/json": {"schema": schema}}},
        "429": paced()})
}

fn paced() -> Value {
    json!({"description": "too many reads at once (observer reads are paced); retry after `Retry-After` seconds"})
}

pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "#/components/schemas/".into())
        .into_generator();
    let mut schema = |f: fn(&mut schemars::SchemaGenerator) -> schemars::Schema| {
        serde_json::to_value(f(&mut generator)).expect("schemas are JSON")
    };
    let job = schema(|g| g.subschema_for::<JobView>());
    let jobs = schema(|g| g.subschema_for::<Vec<JobSummary>>());
    let events = schema(|g| g.subschema_for::<Vec<JobEvent>>());
    let series = schema(|g| g.subschema_for::<Vec<SeriesPoint>>());
    let topology = schema(|g| g.subschema_for::<TopologyDocument>());
    let join = schema(|g| g.subschema_for::<JoinReport>());
    let status = schema(|g| g.subschema_for::<TrainerStatus>());
    let peer = schema(|g| g.subschema_for::<PeerEvent>());
    let schemas = generator.take_definitions(true);
    let ns =
        json!({"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}});
    let name =
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}});
    let id = json!({"name": "id", "in": "path", "required": true, "schema": {"type": "integer"}});
    let from = json!({"name": "from", "in": "query", "required": false, "schema": {"type": "integer"},
        "description": "Skip this many entries (those already read)."});
    let signed = |body: Value, what: &str| {
        json!({"post": {
            "summary": what,
            "parameters": [ns, name, id, {"name": "x-murmur-signature", "in": "header", "required": true,
                "schema": {"type": "string"}, "description": "hex HMAC-SHA256 of the body under the job's peer key"}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": body}}},
            "responses": {"204": {"description": "accepted"}, "400": {"description": "body does not parse or names another member"},
                "401": {"description": "missing or wrong signature"}, "404": {"description": "no such job"}}
        }})
    };
    let base = "/api/v1/namespaces/{namespace}/jobs/{name}";
    json!({
        "openapi": "3.1.0",
        "info": {"title": "murmur status API", "version": env!("CARGO_PKG_VERSION")},
        "paths": {
            "/api/v1/jobs": {"get": {"summary": "Every job served here", "responses": ok(jobs, "one line per job")}},
            base: {"get": {"summary": "A job: phase, conditions, members, topology version, preemptions",
                "parameters": [ns, name], "responses": ok(job, "the job")}},
            format!("{base}/topology"): {"get": {
                "summary": "The topology document; with `after`, a long-poll for a newer one",
                "parameters": [ns, name, {"name": "after", "in": "query", "required": false, "schema": {"type": "integer"}}],
                "responses": {"200": {"description": "a document", "content": {"application/json": {"schema": topology}}},
                    "204": {"description": "none yet, or none newer within the hold"}}}},
            format!("{base}/events"): {"get": {"summary": "What happened to the job", "parameters": [ns, name, from],
                "responses": ok(events, "events, oldest first")}},
            format!("{base}/series"): {"get": {"summary": "Progress samples per member", "parameters": [ns, name, from],
                "responses": ok(series, "samples, oldest first")}},
            format!("{base}/members/{{id}}/join"): signed(join, "A trainer's join report"),
            format!("{base}/members/{{id}}/status"): signed(status, "A trainer's status"),
            format!("{base}/members/{{id}}/peer-events"): signed(peer, "A neighbour missing from a round"),
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "OpenMetrics text"}, "429": paced()}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Readiness", "responses": {"200": {"description": "ok"}}}}
        },
        "components": {"schemas": schemas}
    })
}
