//! Loading a job manifest outside a cluster (`murmur run`, `murmur validate`): the same types and
//! the same CEL rules the apiserver applies, plus a check for unknown fields that the apiserver
//! would silently prune. Every error names the file and the field.

use std::fmt;
use std::path::Path;

use kube::core::CustomResourceExt;

use super::spec::DecentralizedTrainingJob;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: not valid YAML: {message}")]
    Yaml { file: String, message: String },
    #[error(
        "{file}: expected apiVersion {expected_api_version} and kind {expected_kind}, found {found}"
    )]
    WrongKind {
        file: String,
        expected_api_version: String,
        expected_kind: String,
        found: String,
    },
    #[error("{file}: {field}: {message}")]
    Field {
        file: String,
        field: String,
        message: String,
    },
    #[error("{file}: unknown field {}", fields.join(", "))]
    UnknownFields { file: String, fields: Vec<String> },
    #[error("{file}: invalid manifest:\n{}", Violations(violations))]
    Invalid {
        file: String,
        violations: Vec<Violation>,
    },
}

/// One broken rule, with the field it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub message: String,
}

struct Violations<'a>(&'a [Violation]);

impl fmt::Display for Violations<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  - {}: {}", v.field, v.message)?;
        }
        Ok(())
    }
}

impl ManifestError {
    /// Every field this error is about (empty for read and syntax errors).
    pub fn fields(&self) -> Vec<&str> {
        match self {
            ManifestError::Field { field, .. } => vec![field],
            ManifestError::UnknownFields { fields, .. } => {
                fields.iter().map(String::as_str).collect()
            }
            ManifestError::Invalid { violations, .. } => {
                violations.iter().map(|v| v.field.as_str()).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// Decode a job object as the API server holds it (no rule checked): the error names the field
/// that does not fit the types (a number too large, a malformed duration).
pub fn decode_job(
    value: serde_json::Value,
    origin: &str,
) -> Result<DecentralizedTrainingJob, ManifestError> {
    serde_path_to_error::deserialize(value).map_err(|e| ManifestError::Field {
        file: origin.to_string(),
        field: e.path().to_string(),
        message: e.into_inner().to_string(),
    })
}

/// Read and validate a manifest file.
pub fn load_manifest(path: &Path) -> Result<DecentralizedTrainingJob, ManifestError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
        file: file.clone(),
        source,
    })?;
    parse_manifest(&text, &file)
}

/// Parse and validate manifest text; `file` names its origin in errors.
pub fn parse_manifest(text: &str, file: &str) -> Result<DecentralizedTrainingJob, ManifestError> {
    let value: serde_json::Value =
        serde_saphyr::from_str(text).map_err(|e| ManifestError::Yaml {
            file: file.to_string(),
            message: e.to_string(),
        })?;
    check_kind(&value, file)?;

    let mut unknown = Vec::new();
    let mut note_unknown = |path: serde_ignored::Path<'_>| unknown.push(path.to_string());
    let ignoring = serde_ignored::Deserializer::new(&value, &mut note_unknown);
    let job: DecentralizedTrainingJob =
        serde_path_to_error::deserialize(ignoring).map_err(|e| ManifestError::Field {
            file: file.to_string(),
            field: e.path().to_string(),
            message: e.into_inner().to_string(),
        })?;
    // apiVersion and kind were checked above and `status` is the control plane's; anything else
    // unknown is a typo the apiserver would silently prune, so say so.
    unknown.retain(|p| !(p == "apiVersion" || p == "kind" || p.starts_with("status")));
    if !unknown.is_empty() {
        return Err(ManifestError::UnknownFields {
            file: file.to_string(),
            fields: unknown,
        });
    }
    validate(&job).map_err(|violations| ManifestError::Invalid {
        file: file.to_string(),
        violations,
    })?;
    Ok(job)
}

/// The CRD's CEL rules plus the metadata rules the apiserver enforces itself.
pub fn validate(job: &DecentralizedTrainingJob) -> Result<(), Vec<Violation>> {
    let mut violations = Vec::new();
    match job.metadata.name.as_deref() {
        None | Some("") => violations.push(Violation {
            field: "metadata.name".into(),
            message: "is required".into(),
        }),
        Some(name) => {
            if let Err(message) = check_job_name(name) {
                violations.push(Violation {
                    field: "metadata.name".into(),
                    message,
                });
            }
        }
    }
    let schema = schema();
    violations.extend(check_lengths(job, &schema));
    if let Some(template) = &job.spec.trainer.pod_template {
        violations.extend(template.violations(&job.spec));
    }
    if let Err(errors) = cel(job, None, &schema) {
        violations.extend(errors.iter().map(|e| Violation {
            field: e.field_path.clone(),
            message: e.message.clone(),
        }));
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
    }
}

/// Transition rules (immutable fields) between a running job and its edited manifest.
pub fn validate_update(
    new: &DecentralizedTrainingJob,
    old: &DecentralizedTrainingJob,
) -> Result<(), Vec<Violation>> {
    cel(new, Some(old), &schema()).map_err(|errors| {
        errors
            .iter()
            .map(|e| Violation {
                field: e.field_path.clone(),
                message: e.message.clone(),
            })
            .collect()
    })
}

/// The schema's own limits — `maxLength`, `minimum`, `maximum`, `pattern` — which the apiserver
/// enforces and the CEL evaluator does not.
fn check_lengths(job: &DecentralizedTrainingJob, schema: &serde_json::Value) -> Vec<Violation> {
    let value = serde_json::to_value(job).unwrap_or_default();
    let mut out = Vec::new();
    walk_schema(schema, &value, String::new(), &mut out);
    out
}

/// The CRD's schema as JSON text, generated once: it embeds Kubernetes' pod types and takes a
/// while to generate (kube's own `validate_cel` generates it again on every call). It is kept as
/// text and parsed for each validation because the operator validates a job once per generation
/// and lives for months: parsed, it is about 1.1 MB of the operator's heap for good (heaptrack,
/// `e2e/scale/run.sh --members 1000`); as text, 117 kB.
static SCHEMA_JSON: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let crd = super::crd();
    crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_string(s).ok())
        .unwrap_or_default()
});

/// The CRD's schema, parsed from [`SCHEMA_JSON`] for one validation.
fn schema() -> serde_json::Value {
    serde_json::from_str(&SCHEMA_JSON).unwrap_or_default()
}

/// The CRD's CEL rules applied to `job` (and, for transition rules, `old`), as the API server
/// applies them.
fn cel(
    job: &DecentralizedTrainingJob,
    old: Option<&DecentralizedTrainingJob>,
    schema: &serde_json::Value,
) -> Result<(), kube::core::cel::ValidationErrors> {
    let object = serde_json::to_value(job).unwrap_or_default();
    let old = old.map(|o| serde_json::to_value(o).unwrap_or_default());
    kube::core::cel::Validator::new().validate(schema, &object, old.as_ref())
}

fn walk_schema(
    schema: &serde_json::Value,
    value: &serde_json::Value,
    path: String,
    out: &mut Vec<Violation>,
) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    let mut say = |message: String| {
        out.push(Violation {
            field: path.clone(),
            message,
        })
    };
    match value {
        serde_json::Value::String(s) => {
            if let Some(max) = schema.get("maxLength").and_then(|m| m.as_u64())
                && s.chars().count() as u64 > max
            {
                say(format!(
                    "is {} characters, at most {max} allowed",
                    s.chars().count()
                ));
            }
            if let Some(pattern) = schema.get("pattern").and_then(|p| p.as_str())
                && !regex::Regex::new(pattern).is_ok_and(|re| re.is_match(s))
            {
                say(format!("{s:?} does not match {pattern}"));
            }
        }
        serde_json::Value::Number(n) => {
            let n = n.as_f64().unwrap_or_default();
            if let Some(min) = schema.get("minimum").and_then(|m| m.as_f64())
                && n < min
            {
                say(format!("{n} is below the minimum {min}"));
            }
            if let Some(max) = schema.get("maximum").and_then(|m| m.as_f64())
                && n > max
            {
                say(format!("{n} is above the maximum {max}"));
            }
        }
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                let sub = schema
                    .get("properties")
                    .and_then(|p| p.get(key))
                    .or_else(|| schema.get("additionalProperties"));
                if let Some(sub) = sub {
                    walk_schema(sub, child, join(key), out);
                }
            }
        }
        serde_json::Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for (k, child) in items.iter().enumerate() {
                    walk_schema(sub, child, format!("{path}[{k}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// Longest job name: member pods are `<job>-<id>` and must stay valid DNS labels (63 chars).
pub const MAX_JOB_NAME: usize = 52;

fn check_job_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_JOB_NAME {
        return Err(format!(
            "{name:?} is {} characters; at most {MAX_JOB_NAME} so member pod names stay valid DNS labels",
            name.len()
        ));
    }
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let ok_ends = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok_chars && ok_ends {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must be a DNS label: lowercase letters, digits and '-', starting with a letter"
        ))
    }
}

fn check_kind(value: &serde_json::Value, file: &str) -> Result<(), ManifestError> {
    let api_resource = DecentralizedTrainingJob::api_resource();
    let api_version = value.get("apiVersion").and_then(|v| v.as_str());
    let kind = value.get("kind").and_then(|v| v.as_str());
    if api_version == Some(api_resource.api_version.as_str())
        && kind == Some(api_resource.kind.as_str())
    {
        return Ok(());
    }
    let found = if value.is_object() {
        format!(
            "apiVersion {} and kind {}",
            api_version.unwrap_or("<missing>"),
            kind.unwrap_or("<missing>")
        )
    } else {
        "a document that is not a mapping".to_string()
    };
    Err(ManifestError::WrongKind {
        file: file.to_string(),
        expected_api_version: api_resource.api_version,
        expected_kind: api_resource.kind,
        found,
    })
}
