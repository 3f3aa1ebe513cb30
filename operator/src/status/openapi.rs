//! `GET /api/v1/openapi.json`: the status API described as OpenAPI 3.1, its schemas generated
//! from the very types the handlers serialize, so the document cannot drift from the code.

use murmur_core::contract::{JoinReport, MemberView, PeerEvent, TopologyDocument, TrainerStatus};
use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use super::view::{JobEvent, JobSummary, JobView, SeriesPoint};

/// A paced, authorised observer read's answers (see `pacer` and `access`).
fn ok(schema: Value, description: &str) -> Value {
    let mut answers = refusals();
    answers["200"] =
        json!({"description": description, "content": {"application/json": {"schema": schema}}});
    answers
}

/// What an observer read may be refused with.
fn refusals() -> Value {
    json!({"401": {"description": "no bearer token, or one the cluster does not accept (TokenReview)"},
        "403": {"description": "the caller may not get this job (SubjectAccessReview); said whether or not it exists"},
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
    let view = schema(|g| g.subschema_for::<MemberView>());
    let join = schema(|g| g.subschema_for::<JoinReport>());
    let status = schema(|g| g.subschema_for::<TrainerStatus>());
    let peer = schema(|g| g.subschema_for::<PeerEvent>());
    let schemas = generator.take_definitions(true);
    let ns =
        json!({"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}});
    let name =
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}});
    let id = json!({"name": "id", "in": "path", "required": true, "schema": {"type": "integer"}});
    let after =
        json!({"name": "after", "in": "query", "required": false, "schema": {"type": "integer"}});
    let topology_read = |schema: serde_json::Value, summary: &str| {
        json!({"get": {
            "summary": summary,
            "security": [{"jobKey": []}, {"bearer": []}],
            "parameters": [ns, name, after],
            "responses": {"200": {"description": "signed",
                    "headers": {"x-murmur-signature": {"schema": {"type": "string"},
                        "description": "hex HMAC-SHA256 under the job key of `TOPOLOGY {path}\\n` and the body; trainers follow nothing without it"}},
                    "content": {"application/json": {"schema": schema}}},
                "204": {"description": "none yet, or none newer within the hold"},
                "400": {"description": "a trainer's read signed too long ago, or a malformed envelope"},
                "401": {"description": "wrongly signed, or no token the cluster accepts"},
                "403": {"description": "the observer may not get this job"}}}})
    };
    let from = json!({"name": "from", "in": "query", "required": false, "schema": {"type": "integer"},
        "description": "Skip this many entries (those already read)."});
    let header = |name: &str, kind: &str, description: &str| json!({"name": name, "in": "header", "required": true, "schema": {"type": kind}, "description": description});
    let envelope = [
        header(
            "x-murmur-attempt",
            "integer",
            "the member's attempt (MURMUR_ATTEMPT)",
        ),
        header(
            "x-murmur-sequence",
            "integer",
            "above every earlier request of this member attempt",
        ),
        header(
            "x-murmur-time",
            "integer",
            "Unix milliseconds when signed; at most 5 minutes from the server's clock",
        ),
        header(
            "x-murmur-signature",
            "string",
            "hex HMAC-SHA256 under the job key of the method, path, the three values above and the body",
        ),
    ];
    let signed = |body: Value, what: &str| {
        let mut parameters = vec![ns.clone(), name.clone(), id.clone()];
        parameters.extend(envelope.iter().cloned());
        json!({"post": {
            "summary": what,
            "security": [{"jobKey": []}],
            "parameters": parameters,
            "requestBody": {"required": true, "content": {"application/json": {"schema": body}}},
            "responses": {"204": {"description": "accepted"},
                "400": {"description": "body does not parse or names another member; an envelope header missing or malformed; signed too long ago (stale)"},
                "401": {"description": "missing or wrong signature"}, "404": {"description": "no such job"},
                "409": {"description": "replayed or reordered (sequence not above the last accepted), or from an older attempt"}}
        }})
    };
    let observer = json!([{"bearer": []}]);
    let base = "/api/v1/namespaces/{namespace}/jobs/{name}";
    json!({
        "openapi": "3.1.0",
        "info": {"title": "murmur status API", "version": env!("CARGO_PKG_VERSION")},
        "paths": {
            "/api/v1/jobs": {"get": {"summary": "Every job served here that the caller may get",
                "security": observer, "responses": ok(jobs, "one line per job")}},
            base: {"get": {"summary": "A job: phase, conditions, members, topology version, preemptions",
                "security": observer, "parameters": [ns, name], "responses": ok(job, "the job")}},
            format!("{base}/topology"): topology_read(topology, "The whole topology document; with `after`, a long-poll for a newer one. For the job's trainers (a request signed with the job key, as the posts are, but not sequenced) or an observer who may get the job"),
            format!("{base}/members/{{id}}/topology"): topology_read(view, "Member `id`'s view of the topology: its neighbours, their addresses and weights. With `after`, a long-poll that only a change touching the member answers. With `Connection: upgrade` and `Upgrade: murmur-view/1`, answered 101 and then each newer view pushed as a frame (`{length} {signature}\\n` and the JSON; `\\n` alone every 25 s): trainers follow this. Read as the document is"),
            format!("{base}/events"): {"get": {"summary": "What happened to the job", "security": observer, "parameters": [ns, name, from],
                "responses": ok(events, "events, oldest first")}},
            format!("{base}/series"): {"get": {"summary": "Progress samples per member", "security": observer, "parameters": [ns, name, from],
                "responses": ok(series, "samples, oldest first")}},
            format!("{base}/members/{{id}}/join"): signed(join, "A trainer's join report"),
            format!("{base}/members/{{id}}/status"): signed(status, "A trainer's status"),
            format!("{base}/members/{{id}}/peer-events"): signed(peer, "A neighbour missing from a round"),
            "/metrics": {"get": {"summary": "Prometheus metrics, for callers who may get the non-resource URL /metrics",
                "security": observer, "responses": {"200": {"description": "OpenMetrics text"},
                    "401": refusals()["401"], "403": {"description": "the caller may not get /metrics"}, "429": paced()}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Readiness", "responses": {"200": {"description": "ok"}}}}
        },
        "components": {"schemas": schemas, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                "description": "In a cluster: a token the API server accepts (TokenReview), also taken from `x-murmur-authorization` (the API server's service proxy drops `Authorization`). `murmur run` serves its local user without one."},
            "jobKey": {"type": "apiKey", "in": "header", "name": "x-murmur-signature",
                "description": "Trainers: an HMAC-SHA256 under the job key, with the x-murmur-attempt, -sequence and -time headers it covers"}}}
    })
}
