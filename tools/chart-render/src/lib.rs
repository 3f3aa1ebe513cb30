//! Renders a Helm chart the way `helm template` does, without helm (which cannot be installed on
//! the machines that test this project): Go's text/template via `gotmpl`, the chart's values
//! merged with overrides, `.Release` and `.Chart`, and the few Helm functions in [`helm`].
//!
//! Used by the chart's tests and to generate `manifests/install.yaml`.
#![forbid(unsafe_code)]

pub mod helm;

use gotmpl::Template;
use serde_json::{Map, Value as Json, json};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: `{field}` is missing or not a string")]
    Field { path: PathBuf, field: &'static str },
    #[error("{template}: {source}")]
    Template {
        template: String,
        #[source]
        source: gotmpl::TemplateError,
    },
    #[error("{template} renders YAML that does not parse: {message}\n{text}")]
    Output {
        template: String,
        message: String,
        text: String,
    },
}

/// Who is installing: `helm install <name> --namespace <namespace>`.
#[derive(Clone, Debug)]
pub struct Release {
    pub name: String,
    pub namespace: String,
}

impl Default for Release {
    /// What the README's install command uses.
    fn default() -> Self {
        Self {
            name: "murmur".into(),
            namespace: "murmur-system".into(),
        }
    }
}

/// One object of the rendered chart, with the template it came from and its YAML text.
#[derive(Clone, Debug)]
pub struct Document {
    pub source: String,
    pub text: String,
    pub object: Json,
}

/// Helm's install order (`releaseutil.InstallOrder`), so that what a kind needs exists first
/// when `kubectl apply -f manifests/install.yaml` walks the file; other kinds go last.
const INSTALL_ORDER: &[&str] = &[
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "Ingress",
];

fn install_rank(object: &Json) -> usize {
    let kind = object["kind"].as_str().unwrap_or_default();
    INSTALL_ORDER
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(INSTALL_ORDER.len())
}

#[derive(Debug)]
pub struct Chart {
    pub dir: PathBuf,
    /// Chart.yaml, as the template sees it (`.Chart.Name`, `.Chart.AppVersion`, …).
    pub metadata: Json,
    /// values.yaml.
    pub values: Json,
    helpers: String,
    /// (path in the chart, source), sorted by path as helm sorts them.
    templates: Vec<(String, String)>,
    /// The CRDs in `crds/`, in file order.
    pub crds: Vec<(String, String)>,
}

fn read(path: &Path) -> Result<String, ChartError> {
    std::fs::read_to_string(path).map_err(|source| ChartError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_yaml(path: &Path) -> Result<Json, ChartError> {
    serde_saphyr::from_str(&read(path)?).map_err(|e| ChartError::Yaml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn files(dir: &Path) -> Result<Vec<PathBuf>, ChartError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ChartError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    Ok(paths)
}

/// Overrides merged into values the way helm merges `-f`/`--set`: maps recursively, a null
/// removes the key, anything else replaces.
pub fn merge(base: &mut Json, overrides: &Json) {
    match (base, overrides) {
        (Json::Object(base), Json::Object(overrides)) => {
            for (key, value) in overrides {
                if value.is_null() {
                    base.remove(key);
                } else if let Some(existing) = base.get_mut(key) {
                    merge(existing, value);
                } else {
                    base.insert(key.clone(), value.clone());
                }
            }
        }
        (base, overrides) => *base = overrides.clone(),
    }
}

/// `appVersion` -> `AppVersion`: the names templates use for Chart.yaml's fields.
fn capitalised(metadata: &Json) -> Json {
    let Json::Object(fields) = metadata else {
        return Json::Null;
    };
    let mut out = Map::new();
    for (key, value) in fields {
        let mut chars = key.chars();
        let key = match chars.next() {
            Some(first) => first.to_uppercase().chain(chars).collect(),
            None => String::new(),
        };
        out.insert(key, value.clone());
    }
    Json::Object(out)
}

/// Split rendered YAML into its documents (text and object), dropping empty ones.
pub fn split(template: &str, text: &str) -> Result<Vec<(String, Json)>, ChartError> {
    let mut objects = Vec::new();
    for doc in text.split("\n---") {
        let doc = doc.trim_start_matches("---");
        let meaningful = doc
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
        if !meaningful {
            continue;
        }
        let object: Json = serde_saphyr::from_str(doc).map_err(|e| ChartError::Output {
            template: template.to_string(),
            message: e.to_string(),
            text: doc.to_string(),
        })?;
        if !object.is_null() {
            objects.push((doc.trim_matches('\n').to_string(), object));
        }
    }
    Ok(objects)
}

/// The objects in rendered YAML.
pub fn documents(template: &str, text: &str) -> Result<Vec<Json>, ChartError> {
    Ok(split(template, text)?.into_iter().map(|(_, o)| o).collect())
}

impl Chart {
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, ChartError> {
        let dir = dir.as_ref().to_path_buf();
        let metadata_path = dir.join("Chart.yaml");
        let metadata = read_yaml(&metadata_path)?;
        for field in ["name", "version"] {
            if !metadata.get(field).is_some_and(Json::is_string) {
                return Err(ChartError::Field {
                    path: metadata_path,
                    field,
                });
            }
        }
        let values_path = dir.join("values.yaml");
        let values = if values_path.exists() {
            read_yaml(&values_path)?
        } else {
            json!({})
        };
        let mut helpers = String::new();
        let mut templates = Vec::new();
        for path in files(&dir.join("templates"))? {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            if name.starts_with('_') {
                helpers.push_str(&read(&path)?);
                helpers.push('\n');
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                templates.push((format!("templates/{name}"), read(&path)?));
            }
            // NOTES.txt and anything else is not a manifest.
        }
        let mut crds = Vec::new();
        for path in files(&dir.join("crds"))? {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            crds.push((format!("crds/{name}"), read(&path)?));
        }
        Ok(Self {
            dir,
            metadata,
            values,
            helpers,
            templates,
            crds,
        })
    }

    pub fn name(&self) -> &str {
        self.metadata["name"].as_str().unwrap_or_default()
    }

    /// `helm template <release.name> <chart> --namespace <release.namespace>` with `overrides`
    /// merged over values.yaml: every object, in helm's install order.
    pub fn render(&self, release: &Release, overrides: &Json) -> Result<Vec<Document>, ChartError> {
        let mut values = self.values.clone();
        merge(&mut values, overrides);
        let data = helm::from_json(&json!({
            "Values": values,
            "Chart": capitalised(&self.metadata),
            "Release": {
                "Name": release.name,
                "Namespace": release.namespace,
                "Service": "Helm",
                "IsInstall": true,
                "IsUpgrade": false,
                "Revision": 1,
            },
        }));
        let definitions = helm::Definitions::default();
        let parse_error = |template: &str| {
            let template = template.to_string();
            move |source| ChartError::Template { template, source }
        };
        let helpers = Template::new("_helpers.tpl")
            .funcs(helm::functions(definitions.clone()))
            .parse(&self.helpers)
            .map_err(parse_error("templates/_helpers.tpl"))?;
        let _ = definitions.set(helpers);
        let mut out = Vec::new();
        for (source, text) in &self.templates {
            let template = Template::new(source)
                .funcs(helm::functions(definitions.clone()))
                .parse(&self.helpers)
                .and_then(|t| t.parse(text))
                .map_err(parse_error(source))?;
            let text = template
                .execute_to_string(&data)
                .map_err(parse_error(source))?;
            for (text, object) in split(source, &text)? {
                out.push(Document {
                    source: format!("{}/{source}", self.name()),
                    text,
                    object,
                });
            }
        }
        out.sort_by_key(|d| install_rank(&d.object));
        Ok(out)
    }

    /// Every object `render` makes, in order.
    pub fn objects(&self, release: &Release, overrides: &Json) -> Result<Vec<Json>, ChartError> {
        Ok(self
            .render(release, overrides)?
            .into_iter()
            .map(|d| d.object)
            .collect())
    }

    /// `manifests/install.yaml`: the namespace, the CRDs and the chart with default values, for
    /// `kubectl apply -f` without helm.
    pub fn install_manifest(&self, release: &Release) -> Result<String, ChartError> {
        let mut out = format!(
            "# Generated from charts/{chart} with default values (release {name}, namespace {ns}):\n\
             #   cargo run -p murmur-chart -- install > manifests/install.yaml\n\
             # Do not edit by hand; CI checks it is up to date.\n\
             ---\n\
             apiVersion: v1\n\
             kind: Namespace\n\
             metadata:\n  name: {ns}\n",
            chart = self.name(),
            name = release.name,
            ns = release.namespace,
        );
        for (source, text) in &self.crds {
            out.push_str(&format!("---\n# Source: {}/{source}\n", self.name()));
            out.push_str(text.trim_start_matches("---\n").trim_end());
            out.push('\n');
        }
        out.push_str(&to_yaml(&self.render(release, &json!({}))?));
        Ok(out)
    }
}

/// Rendered documents as one multi-document YAML stream, each headed by its template, as
/// `helm template` prints them.
pub fn to_yaml(documents: &[Document]) -> String {
    documents
        .iter()
        .map(|d| format!("---\n# Source: {}\n{}\n", d.source, d.text))
        .collect()
}

/// The repository's chart: `charts/murmur` next to this crate.
pub fn repository_chart() -> Result<Chart, ChartError> {
    Chart::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/murmur"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_overrides_replaces_leaves_recurses_into_maps_and_null_removes() {
        let mut base = json!({"a": {"b": 1, "c": 2}, "d": [1, 2], "e": "x"});
        merge(
            &mut base,
            &json!({"a": {"b": 5, "z": 0}, "d": [3], "e": null, "f": true}),
        );
        assert_eq!(
            base,
            json!({"a": {"b": 5, "c": 2, "z": 0}, "d": [3], "f": true})
        );
    }

    #[test]
    fn documents_skip_empty_and_comment_only_parts() {
        let text = "---\n# Source: x\n\n---\na: 1\n---\n   \n---\nb: [2]\n";
        let objects = documents("t", text).unwrap();
        assert_eq!(objects, vec![json!({"a": 1}), json!({"b": [2]})]);
        let e = documents("templates/bad.yaml", "a: [1\n").unwrap_err();
        assert!(e.to_string().starts_with("templates/bad.yaml"), "{e}");
    }

    #[test]
    fn a_chart_without_a_name_is_refused_with_the_file_named() {
        let dir = std::env::temp_dir().join(format!("murmur-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Chart.yaml"), "version: 0.1.0\n").unwrap();
        let e = Chart::load(&dir).unwrap_err();
        assert!(e.to_string().contains("Chart.yaml: `name`"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
