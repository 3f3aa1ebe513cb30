//! The API reference in Markdown, generated from the CRD's schema (`murmur crd --reference`,
//! what `docs/reference/api.md` holds): one section per object, a row per field with its type,
//! default, bounds and description, and the CEL rules the API server applies.

use std::fmt::Write;

use serde_json::{Map, Value};

/// Bounds that only restate an integer's width (added to every integer of the CRD): not shown.
const WIDTH_BOUNDS: [f64; 5] = [
    i32::MIN as f64,
    i32::MAX as f64,
    u32::MAX as f64,
    i64::MIN as f64,
    i64::MAX as f64,
];

/// The reference for the CRD `murmur crd` prints.
pub fn api_reference() -> String {
    let crd = serde_json::to_value(super::crd()).expect("a CRD serializes");
    reference(&crd)
}

/// The reference for a CustomResourceDefinition as JSON: each version's printer columns and
/// schema.
pub fn reference(crd: &Value) -> String {
    let spec = &crd["spec"];
    let kind = spec["names"]["kind"].as_str().unwrap_or("?");
    let group = spec["group"].as_str().unwrap_or("?");
    let mut out = String::new();
    let _ = writeln!(out, "# API reference: {kind}\n");
    let _ = writeln!(
        out,
        "Generated from the CRD by `murmur crd --reference`; do not edit by hand. The guide to \
         these fields, with examples, is [the job spec](../job-spec.md).\n"
    );
    let short: Vec<&str> = spec["names"]["shortNames"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "- Group: `{group}`; kind `{kind}`; plural `{}`; short names: {}; scope: {}.",
        spec["names"]["plural"].as_str().unwrap_or("?"),
        short
            .iter()
            .map(|s| format!("`{s}`"))
            .collect::<Vec<_>>()
            .join(", "),
        spec["scope"].as_str().unwrap_or("?"),
    );
    for version in spec["versions"].as_array().into_iter().flatten() {
        let name = version["name"].as_str().unwrap_or("?");
        let _ = writeln!(out, "\n## `{group}/{name}`\n");
        if let Some(columns) = version["additionalPrinterColumns"].as_array() {
            let _ = writeln!(out, "`kubectl get` columns:\n");
            let _ = writeln!(out, "| Column | Value | Description |");
            let _ = writeln!(out, "| --- | --- | --- |");
            for c in columns {
                let _ = writeln!(
                    out,
                    "| {} | `{}` | {} |",
                    c["name"].as_str().unwrap_or(""),
                    c["jsonPath"].as_str().unwrap_or(""),
                    cell(c["description"].as_str().unwrap_or(""))
                );
            }
        }
        let root = &version["schema"]["openAPIV3Schema"];
        if let Some(props) = root["properties"].as_object() {
            for (field, schema) in props {
                if schema.get("properties").is_some() {
                    object_section(&mut out, field, schema);
                }
            }
        }
    }
    out
}

/// A section for the object at `path`, then one for each object below it, depth first.
fn object_section(out: &mut String, path: &str, schema: &Value) {
    let _ = writeln!(out, "\n### <a id=\"{}\"></a>`.{path}`\n", anchor(path));
    if let Some(d) = schema["description"].as_str() {
        let _ = writeln!(out, "{}\n", d.trim());
    }
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "| Field | Type | Default | Description |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    let mut below = Vec::new();
    for (field, s) in props {
        let (ty, nested) = type_of(path, field, s);
        if let Some(n) = nested {
            below.push(n);
        }
        let mut notes = Vec::new();
        if required.contains(&field.as_str()) {
            notes.push("**Required.**".to_string());
        }
        notes.extend(constraints(innermost(s)));
        let description = s["description"].as_str().unwrap_or("");
        let text = [cell(description)]
            .into_iter()
            .chain(notes)
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let default = s
            .get("default")
            .map(|d| format!("`{}`", cell(&d.to_string())))
            .unwrap_or_default();
        let _ = writeln!(out, "| `{field}` | {ty} | {default} | {text} |");
    }
    if let Some(rules) = schema["x-kubernetes-validations"].as_array() {
        let _ = writeln!(out, "\nRules the API server applies:\n");
        for r in rules {
            let _ = writeln!(
                out,
                "- {} (`{}`)",
                r["message"].as_str().unwrap_or("(no message)"),
                r["rule"].as_str().unwrap_or("").replace('`', "'")
            );
        }
    }
    for (p, s) in below {
        object_section(out, &p, &s);
    }
}

/// What a value of `field` holds, as the table shows it, and the object below it to document
/// in its own section (its path and schema), if any.
fn type_of(path: &str, field: &str, s: &Value) -> (String, Option<(String, Value)>) {
    let here = format!("{path}.{field}");
    if path == POD_SPEC && is_object_or_list_of_objects(s) {
        // A pod spec's own field: Kubernetes documents it.
        let name = field.trim_end_matches("[]");
        return (
            format!("as in a pod: `kubectl explain pod.spec.{name}`"),
            None,
        );
    }
    let optional = if s["nullable"].as_bool() == Some(true) {
        " (optional)"
    } else {
        ""
    };
    if s.get("x-kubernetes-int-or-string").is_some() {
        return (format!("integer or string{optional}"), None);
    }
    match s["type"].as_str() {
        Some("object") if s.get("properties").is_some() => (
            format!("[object](#{}){optional}", anchor(&here)),
            Some((here, s.clone())),
        ),
        Some("object") => match s.get("additionalProperties") {
            Some(v) if v.is_object() => {
                let (inner, nested) = type_of(path, &format!("{field}.*"), v);
                (format!("map of string to {inner}{optional}"), nested)
            }
            _ => (format!("object{optional}"), None),
        },
        Some("array") => {
            let (inner, nested) = type_of(path, &format!("{field}[]"), &s["items"]);
            (format!("list of {inner}{optional}"), nested)
        }
        Some(t) => {
            let format = s["format"]
                .as_str()
                .filter(|f| !matches!(*f, "int32" | "int64" | "double"))
                .map(|f| format!(" ({f})"))
                .unwrap_or_default();
            (format!("{t}{format}{optional}"), None)
        }
        None => (format!("any{optional}"), None),
    }
}

/// The pod template's spec, whose fields are a pod's (their schema is Kubernetes').
const POD_SPEC: &str = "spec.trainer.podTemplate.spec";

fn is_object_or_list_of_objects(s: &Value) -> bool {
    match s["type"].as_str() {
        Some("object") => s.get("properties").is_some(),
        Some("array") => is_object_or_list_of_objects(&s["items"]),
        _ => false,
    }
}

/// The schema of the values a field holds, past lists and maps.
fn innermost(s: &Value) -> &Value {
    match s["type"].as_str() {
        Some("array") => innermost(&s["items"]),
        Some("object") if s.get("properties").is_none() => match s.get("additionalProperties") {
            Some(v) if v.is_object() => innermost(v),
            _ => s,
        },
        _ => s,
    }
}

/// Enum values, bounds, lengths and patterns, as short notes.
fn constraints(s: &Value) -> Vec<String> {
    let mut notes = Vec::new();
    let Some(map) = s.as_object() else {
        return notes;
    };
    if let Some(values) = map.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .map(|v| match v.as_str() {
                Some(s) => format!("`{s}`"),
                None => format!("`{v}`"),
            })
            .collect();
        notes.push(format!("One of {}.", values.join(", ")));
    }
    // An unsigned integer's minimum of 0 is its width too.
    let width = |key: &str, b: f64| {
        WIDTH_BOUNDS.contains(&b) || (b == 0.0 && key == "minimum" && is_unsigned(map))
    };
    let bound = |key: &str| {
        map.get(key)
            .and_then(Value::as_f64)
            .filter(|&b| !width(key, b))
    };
    match (bound("minimum"), bound("maximum")) {
        (Some(lo), Some(hi)) => notes.push(format!("From {} to {}.", number(lo), number(hi))),
        (Some(lo), None) => notes.push(format!("At least {}.", number(lo))),
        (None, Some(hi)) => notes.push(format!("At most {}.", number(hi))),
        (None, None) => {}
    }
    for (key, what) in [
        ("minLength", "At least {} characters."),
        ("maxLength", "At most {} characters."),
        ("minItems", "At least {} items."),
        ("maxItems", "At most {} items."),
    ] {
        if let Some(n) = map.get(key).and_then(Value::as_u64) {
            notes.push(what.replace("{}", &n.to_string()));
        }
    }
    if let Some(p) = map.get("pattern").and_then(Value::as_str) {
        notes.push(format!("Matches `{}`.", p.replace('|', "\\|")));
    }
    notes
}

/// Unsigned integers get a minimum of 0 from their width alone.
fn is_unsigned(map: &Map<String, Value>) -> bool {
    map.get("maximum")
        .and_then(Value::as_f64)
        .is_some_and(|m| m == u32::MAX as f64 || m == i64::MAX as f64)
}

fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

/// The id a section's heading carries: its path, without the characters anchors drop.
fn anchor(path: &str) -> String {
    path.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
        .collect::<String>()
        .to_lowercase()
}

/// Text that fits a table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(schema: Value) -> Value {
        json!({"spec": {
            "group": "g.dev", "scope": "Namespaced",
            "names": {"kind": "Thing", "plural": "things", "shortNames": ["th"]},
            "versions": [{"name": "v1", "schema": {"openAPIV3Schema": {"properties": {"spec": schema}}}}]
        }})
    }

    #[test]
    fn every_field_gets_a_row_and_every_object_a_section() {
        let md = reference(&crd(json!({
            "type": "object", "description": "The spec.", "required": ["size"],
            "properties": {
                "size": {"type": "integer", "format": "int64", "minimum": 1, "maximum": 4294967295.0,
                         "description": "How many."},
                "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
                "parts": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string", "maxLength": 63, "description": "A | name\nover lines."}
                }}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
            },
            "x-kubernetes-validations": [{"rule": "self.size < 10", "message": "size must be under 10"}]
        })));
        assert!(
            md.contains("### <a id=\"spec\"></a>`.spec`\n\nThe spec."),
            "{md}"
        );
        assert!(
            md.contains("| `size` | integer |  | How many. **Required.** At least 1. |"),
            "{md}"
        );
        assert!(
            md.contains("| `mode` | string | `\"fast\"` | One of `fast`, `slow`. |"),
            "{md}"
        );
        assert!(
            md.contains("| `parts` | list of [object](#spec.parts) |"),
            "{md}"
        );
        assert!(
            md.contains("<a id=\"spec.parts\"></a>`.spec.parts[]`"),
            "{md}"
        );
        assert!(
            md.contains("| `name` | string |  | A \\| name over lines. At most 63 characters. |"),
            "{md}"
        );
        assert!(
            md.contains("| `labels` | map of string to string |"),
            "{md}"
        );
        assert!(
            md.contains("- size must be under 10 (`self.size < 10`)"),
            "{md}"
        );
    }

    #[test]
    fn the_real_crd_documents_every_spec_field() {
        let md = api_reference();
        let crd = serde_json::to_value(crate::api::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        for field in spec["properties"].as_object().unwrap().keys() {
            assert!(md.contains(&format!("| `{field}` |")), "{field} missing");
        }
        assert!(md.contains("`.spec.algorithm`"));
        assert!(md.contains("`.status`"));
    }
}
