//! The Helm (sprig) functions the chart uses, on top of Go's built-ins. Only these: a template
//! calling anything else fails to parse, so the chart cannot drift into functions this renderer
//! would get wrong.

use std::sync::{Arc, OnceLock};

use gotmpl::{FuncMap, Template, TemplateError, Value};

/// The named templates (`_helpers.tpl`), for `include`; set once they are parsed.
pub type Definitions = Arc<OnceLock<Template>>;

pub const FUNCTIONS: &[&str] = &[
    "include",
    "toYaml",
    "indent",
    "nindent",
    "quote",
    "default",
    "required",
    "trunc",
    "trimSuffix",
    "contains",
];

fn fail(function: &str, message: impl std::fmt::Display) -> TemplateError {
    TemplateError::Exec(format!("{function}: {message}"))
}

fn arg<'a>(function: &str, args: &'a [Value], i: usize) -> Result<&'a Value, TemplateError> {
    args.get(i)
        .ok_or_else(|| fail(function, format!("needs {} arguments", i + 1)))
}

fn string(function: &str, args: &[Value], i: usize) -> Result<String, TemplateError> {
    Ok(match arg(function, args, i)? {
        Value::Nil => String::new(),
        v => v.to_string(),
    })
}

fn int(function: &str, args: &[Value], i: usize) -> Result<usize, TemplateError> {
    let v = arg(function, args, i)?;
    let n = match v {
        Value::Int(n) => *n,
        Value::Uint(n) => i64::try_from(*n).unwrap_or(i64::MAX),
        Value::Float(f) if f.fract() == 0.0 => *f as i64,
        other => return Err(fail(function, format!("{other} is not a whole number"))),
    };
    usize::try_from(n).map_err(|_| fail(function, format!("{n} is negative")))
}

/// Sprig's notion of empty, which `default` and `required` use.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Nil => true,
        Value::Bool(b) => !b,
        Value::Int(n) => *n == 0,
        Value::Uint(n) => *n == 0,
        Value::Float(f) => *f == 0.0,
        Value::String(s) => s.is_empty(),
        Value::List(l) => l.is_empty(),
        Value::Map(m) => m.is_empty(),
        _ => false,
    }
}

/// A template value as JSON (for `toYaml`). Whole floats print as integers, as Go's YAML does.
pub fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Nil => serde_json::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Int(n) => (*n).into(),
        Value::Uint(n) => (*n).into(),
        Value::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 => (*f as i64).into(),
        Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Value::String(s) => s.to_string().into(),
        Value::List(l) => l.iter().map(to_json).collect(),
        Value::Map(m) => m
            .iter()
            .map(|(k, v)| (k.to_string(), to_json(v)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        other => other.to_string().into(),
    }
}

/// JSON as a template value. Numbers become floats, as in Helm (values pass through JSON into
/// Go's `float64`), so a chart that only works on integers fails here as it would there.
pub fn from_json(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => Value::Float(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Value::String(s.as_str().into()),
        serde_json::Value::Array(a) => Value::List(a.iter().map(from_json).collect()),
        serde_json::Value::Object(o) => Value::Map(Arc::new(
            o.iter()
                .map(|(k, v)| (Arc::from(k.as_str()), from_json(v)))
                .collect(),
        )),
    }
}

fn indent(pad: usize, text: &str) -> String {
    let pad = " ".repeat(pad);
    format!("{pad}{}", text.replace('\n', &format!("\n{pad}")))
}

/// Go's `%q` for the strings a chart quotes (JSON escaping agrees with it on ASCII).
fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

pub fn functions(definitions: Definitions) -> FuncMap {
    let mut map = FuncMap::new();
    let mut add = |name: &str, f: gotmpl::ValueFunc| {
        map.insert(name.to_string(), f);
    };
    add(
        "include",
        Arc::new(move |args| {
            let name = string("include", args, 0)?;
            let data = args.get(1).cloned().unwrap_or(Value::Nil);
            let helpers = definitions
                .get()
                .ok_or_else(|| fail("include", "called before the helpers were parsed"))?;
            helpers
                .execute_template_to_string(&name, &data)
                .map(|s| Value::String(s.into()))
        }),
    );
    add(
        "toYaml",
        Arc::new(|args| {
            let json = to_json(arg("toYaml", args, 0)?);
            let yaml = serde_saphyr::to_string(&json).map_err(|e| fail("toYaml", e))?;
            Ok(Value::String(yaml.trim_end_matches('\n').into()))
        }),
    );
    add(
        "indent",
        Arc::new(|args| {
            let text = string("indent", args, 1)?;
            Ok(Value::String(indent(int("indent", args, 0)?, &text).into()))
        }),
    );
    add(
        "nindent",
        Arc::new(|args| {
            let text = string("nindent", args, 1)?;
            let indented = indent(int("nindent", args, 0)?, &text);
            Ok(Value::String(format!("\n{indented}").into()))
        }),
    );
    add(
        "quote",
        Arc::new(|args| {
            let quoted: Vec<String> = args
                .iter()
                .filter(|v| !matches!(v, Value::Nil))
                .map(|v| go_quote(&v.to_string()))
                .collect();
            Ok(Value::String(quoted.join(" ").into()))
        }),
    );
    add(
        "default",
        Arc::new(|args| {
            let fallback = arg("default", args, 0)?;
            Ok(match args.get(1) {
                Some(given) if !is_empty(given) => given.clone(),
                _ => fallback.clone(),
            })
        }),
    );
    add(
        "required",
        Arc::new(|args| {
            let message = string("required", args, 0)?;
            match args.get(1) {
                Some(v) if !is_empty(v) || matches!(v, Value::Bool(false)) => Ok(v.clone()),
                _ => Err(fail("required", message)),
            }
        }),
    );
    add(
        "trunc",
        Arc::new(|args| {
            let n = int("trunc", args, 0)?;
            let text = string("trunc", args, 1)?;
            Ok(Value::String(
                text.chars().take(n).collect::<String>().into(),
            ))
        }),
    );
    add(
        "trimSuffix",
        Arc::new(|args| {
            let suffix = string("trimSuffix", args, 0)?;
            let text = string("trimSuffix", args, 1)?;
            let trimmed = text.strip_suffix(suffix.as_str()).unwrap_or(&text);
            Ok(Value::String(trimmed.into()))
        }),
    );
    add(
        "contains",
        Arc::new(|args| {
            let needle = string("contains", args, 0)?;
            Ok(Value::Bool(string("contains", args, 1)?.contains(&needle)))
        }),
    );
    debug_assert_eq!(map.len(), FUNCTIONS.len());
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, data: serde_json::Value) -> Result<String, TemplateError> {
        let definitions = Definitions::default();
        let helpers = Template::new("helpers")
            .funcs(functions(definitions.clone()))
            .parse(r#"{{- define "greeting" -}}hello {{ . }}{{- end -}}"#)?;
        let _ = definitions.set(helpers);
        Template::new("t")
            .funcs(functions(definitions))
            .parse(src)?
            .execute_to_string(&from_json(&data))
    }

    #[test]
    fn the_functions_behave_as_in_helm() {
        let data = serde_json::json!({
            "n": 3, "s": "murmur-", "empty": "", "map": {"b": 1, "a": [1.5, "x"]}, "no": false
        });
        let cases = [
            (r#"{{ include "greeting" .s }}"#, "hello murmur-"),
            (
                r#"x:{{ include "greeting" "w" | nindent 2 }}"#,
                "x:\n  hello w",
            ),
            ("{{ .map | toYaml }}", "a:\n- 1.5\n- x\nb: 1"),
            ("{{ .n }}", "3"),
            ("{{ .s | quote }}", "\"murmur-\""),
            ("{{ .s | trimSuffix \"-\" }}", "murmur"),
            ("{{ .s | trunc 3 }}", "mur"),
            ("{{ .empty | default \"d\" }}", "d"),
            ("{{ .s | default \"d\" }}", "murmur-"),
            ("{{ .missing | default 7 }}", "7"),
            ("{{ contains \"mur\" .s }}", "true"),
            ("{{ \"a\nb\" | indent 2 }}", "  a\n  b"),
            ("{{ required \"no\" .no }}", "false"),
        ];
        for (src, want) in cases {
            let got = render(src, data.clone()).unwrap();
            // Sequences may be indented or not; both are YAML. Compare what they mean.
            if src.contains("toYaml") {
                let got: serde_json::Value = serde_saphyr::from_str(&got).unwrap();
                let want: serde_json::Value = serde_saphyr::from_str(want).unwrap();
                assert_eq!(got, want, "{src}");
            } else {
                assert_eq!(got, want, "{src}");
            }
        }
    }

    #[test]
    fn required_and_bad_arguments_fail_with_the_function_named() {
        let e = render(
            "{{ required \"image.repository is required\" .x }}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("image.repository is required"),
            "{e}"
        );
        let e = render("{{ trunc \"x\" .s }}", serde_json::json!({"s": "y"})).unwrap_err();
        assert!(e.to_string().contains("trunc"), "{e}");
    }

    #[test]
    fn a_function_helm_has_but_this_renderer_lacks_fails_at_parse() {
        let e = render("{{ .x | b64enc }}", serde_json::json!({"x": "y"})).unwrap_err();
        assert!(e.to_string().contains("b64enc"), "{e}");
    }
}
