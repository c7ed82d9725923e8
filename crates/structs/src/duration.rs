//! Durations in Go's notation (`"15s"`, `"1m30s"`, `"250ms"`), as Consul's JSON carries them.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use std::{fmt, time::Duration};

/// A duration that reads and writes Go's `time.Duration` text form; a bare number is taken as
/// nanoseconds, as Go's JSON does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration(pub Duration);

/// Why a duration string was rejected; the message shows what a duration looks like.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}: use a duration like 10s, 1m30s or 250ms")]
pub struct DurationError {
    /// The text that was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl GoDuration {
    /// Parses Go's duration syntax: a sequence of decimal numbers with units
    /// `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`; `"0"` alone is zero. Negative durations are refused.
    pub fn parse(input: &str) -> Result<Self, DurationError> {
        let err = |reason| DurationError {
            input: input.to_owned(),
            reason,
        };
        let s = input.trim();
        if s == "0" {
            return Ok(Self(Duration::ZERO));
        }
        if s.is_empty() {
            return Err(err("empty"));
        }
        if s.starts_with('-') {
            return Err(err("negative durations are not allowed"));
        }
        let s = s.strip_prefix('+').unwrap_or(s);
        let mut total_nanos: f64 = 0.0;
        let mut rest = s;
        while !rest.is_empty() {
            let num_end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| err("missing unit"))?;
            if num_end == 0 {
                return Err(err("expected a number"));
            }
            let number: f64 = rest[..num_end].parse().map_err(|_| err("bad number"))?;
            rest = &rest[num_end..];
            let unit_end = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let scale = match &rest[..unit_end] {
                "ns" => 1.0,
                "us" | "µs" | "μs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                _ => return Err(err("unknown unit")),
            };
            total_nanos += number * scale;
            rest = &rest[unit_end..];
        }
        if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
            return Err(err("out of range"));
        }
        Ok(Self(Duration::from_nanos(total_nanos.round() as u64)))
    }

    /// True for the zero duration (Consul's "not set").
    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0s");
        }
        let nanos = d.as_nanos();
        if nanos < 1_000 {
            return write!(f, "{nanos}ns");
        }
        if nanos < 1_000_000 {
            return write!(f, "{}us", trim_float(nanos as f64 / 1e3));
        }
        if nanos < 1_000_000_000 {
            return write!(f, "{}ms", trim_float(nanos as f64 / 1e6));
        }
        let secs = d.as_secs();
        let (h, m) = (secs / 3600, (secs % 3600) / 60);
        let s = (secs % 60) as f64 + f64::from(d.subsec_nanos()) / 1e9;
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if h > 0 || m > 0 {
            write!(f, "{m}m")?;
        }
        write!(f, "{}s", trim_float(s))
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.9}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = GoDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration like 10s (a string such as \"10s\" or \"1m30s\", or a number of nanoseconds)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GoDuration, E> {
                GoDuration::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GoDuration, E> {
                Ok(GoDuration(Duration::from_nanos(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GoDuration, E> {
                u64::try_from(v)
                    .map(|n| GoDuration(Duration::from_nanos(n)))
                    .map_err(|_| E::custom("negative durations are not allowed"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<GoDuration, E> {
                if v < 0.0 || !v.is_finite() {
                    return Err(E::custom("duration out of range"));
                }
                Ok(GoDuration(Duration::from_nanos(v as u64)))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        let ms = |n| GoDuration(Duration::from_millis(n));
        assert_eq!(GoDuration::parse("15s").unwrap(), ms(15_000));
        assert_eq!(GoDuration::parse("1m30s").unwrap(), ms(90_000));
        assert_eq!(GoDuration::parse("250ms").unwrap(), ms(250));
        assert_eq!(GoDuration::parse("1.5h").unwrap(), ms(5_400_000));
        assert_eq!(GoDuration::parse("0").unwrap(), ms(0));
        assert!(GoDuration::parse("10").is_err());
        assert!(GoDuration::parse("-1s").is_err());
        assert!(GoDuration::parse("3 days").is_err());
        assert!(GoDuration::parse("").is_err());
    }

    #[test]
    fn errors_show_what_a_duration_looks_like() {
        let e = GoDuration::parse("nope").unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid duration \"nope\": expected a number: use a duration like 10s, 1m30s or 250ms"
        );
        let e = serde_json::from_str::<GoDuration>("true").unwrap_err().to_string();
        assert!(e.contains("expected a duration like 10s"), "{e}");
    }

    #[test]
    fn displays_like_go() {
        for s in ["15s", "1m30s", "250ms", "1h0m0s", "1.5s", "500us", "7ns", "0s"] {
            assert_eq!(GoDuration::parse(s).unwrap().to_string(), s);
        }
    }
}
