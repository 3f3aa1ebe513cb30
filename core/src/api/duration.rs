//! Go-style durations (`"500ms"`, `"20s"`, `"1h30m"`), the form Kubernetes users already write.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Regular expression the CRD schema uses for durations. Bounded (at most four parts of at most
/// six digits each side of the point) so that anything the API server accepts, the parser below
/// decodes: unbounded, `99999999999h` passed the API server and then failed to decode in the
/// operator, stopping every job's reconcile. The parser accepts a little more (any length up to
/// 31 000 years, so that what `Display` writes always parses back); `murmur validate` checks the
/// pattern itself, as the API server does.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,6}(\.[0-9]{1,6})?(ms|s|m|h)){1,4}$";

/// A non-negative duration written like Go's `time.ParseDuration`, limited to ms/s/m/h units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (examples: \"500ms\", \"20s\", \"1h30m\")")]
pub struct DurationError {
    pub input: String,
    pub reason: &'static str,
}

impl Duration {
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Self(std::time::Duration::from_millis(ms))
    }
    pub fn as_std(self) -> std::time::Duration {
        self.0
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| DurationError {
            input: input.to_string(),
            reason,
        };
        if input.is_empty() {
            return Err(err("empty"));
        }
        let mut rest = input;
        let mut total_ms = 0f64;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| err("missing unit after number"))?;
            if digits == 0 {
                return Err(err("expected a number"));
            }
            let text = &rest[..digits];
            let well_formed = match text.split_once('.') {
                None => true,
                Some((int, frac)) => !int.is_empty() && !frac.is_empty() && !frac.contains('.'),
            };
            if !well_formed {
                return Err(err("malformed number"));
            }
            let number: f64 = text.parse().map_err(|_| err("malformed number"))?;
            rest = &rest[digits..];
            let (unit_ms, len) = if rest.starts_with("ms") {
                (1.0, 2)
            } else if rest.starts_with('s') {
                (1e3, 1)
            } else if rest.starts_with('m') {
                (60e3, 1)
            } else if rest.starts_with('h') {
                (3600e3, 1)
            } else {
                return Err(err("unknown unit (use ms, s, m or h)"));
            };
            total_ms += number * unit_ms;
            rest = &rest[len..];
        }
        if !total_ms.is_finite() || total_ms > 1e15 {
            return Err(err("too large"));
        }
        Ok(Self(std::time::Duration::from_micros(
            (total_ms * 1e3).round() as u64,
        )))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 {
            return write!(f, "0s");
        }
        if !ms.is_multiple_of(1000) {
            return write!(f, "{ms}ms");
        }
        let mut secs = ms / 1000;
        let hours = secs / 3600;
        secs %= 3600;
        let minutes = secs / 60;
        secs %= 60;
        if hours > 0 {
            write!(f, "{hours}h")?;
        }
        if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        if secs > 0 {
            write!(f, "{secs}s")?;
        }
        Ok(())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "description": "A duration such as 500ms, 20s, 5m or 1h30m."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_durations() {
        let cases = [
            ("500ms", 500),
            ("20s", 20_000),
            ("1.5s", 1_500),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("1m30s250ms", 90_250),
        ];
        for (text, ms) in cases {
            let d: Duration = text.parse().unwrap();
            assert_eq!(d.0.as_millis(), ms, "{text}");
        }
    }

    #[test]
    fn rejects_malformed_durations_with_a_reason() {
        for bad in ["", "20", "s", "20x", "-5s", "1..5s", "5 s"] {
            let err = bad.parse::<Duration>().unwrap_err();
            assert_eq!(err.input, bad);
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["500ms", "20s", "5m", "1h30m", "1h", "1m5s", "0s"] {
            let d: Duration = text.parse().unwrap();
            assert_eq!(d.to_string(), text);
            assert_eq!(d.to_string().parse::<Duration>().unwrap(), d);
        }
    }

    #[test]
    fn the_parser_takes_everything_the_schema_pattern_takes() {
        // The apiserver checks the pattern, the operator and trainers use the parser.
        let re = regex::Regex::new(DURATION_PATTERN).unwrap();
        for text in [
            "10s",
            "1h2m3s4ms",
            "0.5s",
            "10",
            "",
            "s",
            "1.s",
            "5 s",
            "-1s",
            "1d",
            "3ms5",
            "99999999999h",
            "1234567s",
            "1s1s1s1s1s",
            "999999.999999h999999.999999h999999.999999h999999.999999h",
        ] {
            if re.is_match(text) {
                assert!(
                    text.parse::<Duration>().is_ok(),
                    "the parser refuses {text:?}"
                );
            }
        }
        assert!(!re.is_match("99999999999h"), "unbounded");
        assert!(!re.is_match("1s1s1s1s1s"));
        assert!(re.is_match("999999.999999h999999.999999h999999.999999h999999.999999h"));
    }

    proptest::proptest! {
        /// Whatever the API server's pattern lets through, the operator decodes.
        #[test]
        fn every_duration_the_pattern_accepts_parses(text in DURATION_PATTERN.trim_start_matches('^').trim_end_matches('$')) {
            proptest::prop_assert!(text.parse::<Duration>().is_ok(), "{:?}", text);
        }

        /// What `Display` writes always parses back, for any duration up to 285 years (beyond,
        /// the parser's f64 loses microseconds).
        #[test]
        fn display_always_parses_back(ms in 0u64..9_000_000_000_000) {
            let d = Duration::from_millis(ms);
            proptest::prop_assert_eq!(d.to_string().parse::<Duration>().unwrap(), d);
        }
    }
}
