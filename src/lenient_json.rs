//! JSON as Python writes it: `json.dump` emits the bare literals `NaN`, `Infinity` and
//! `-Infinity`, which strict JSON parsers reject. [`parse`] turns each one (outside strings)
//! into the string `"NaN"` / `"Infinity"` / `"-Infinity"` that trmask's readers accept, and
//! parses the rest as ordinary JSON.

use std::borrow::Cow;

/// `text` with the bare non-finite literals quoted (borrowed when there are none).
pub fn quote_non_finite(text: &str) -> Cow<'_, str> {
    let b = text.as_bytes();
    if !b.iter().any(|&c| c == b'N' || c == b'I') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let (mut i, mut last, mut in_str) = (0, 0, false);
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_str = true;
            i += 1;
            continue;
        }
        let lit = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|l| b[i..].starts_with(l.as_bytes()));
        match lit {
            Some(l) => {
                out.push_str(&text[last..i]);
                out.push('"');
                out.push_str(l);
                out.push('"');
                i += l.len();
                last = i;
            }
            None => i += 1,
        }
    }
    out.push_str(&text[last..]);
    Cow::Owned(out)
}

/// Parses JSON, accepting Python's bare `NaN`, `Infinity` and `-Infinity` (as strings).
pub fn parse(text: &str) -> serde_json::Result<serde_json::Value> {
    serde_json::from_str(&quote_non_finite(text))
}

/// The value of a non-finite marker string (`"NaN"`, `"Infinity"`, `"-Infinity"`).
pub fn non_finite(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_literals_are_quoted_outside_strings_only() {
        let v =
            parse(r#"{"a": [NaN, -Infinity, Infinity, 1], "NaN s": "x NaN \" Infinity"}"#).unwrap();
        assert_eq!(v["a"][0], "NaN");
        assert_eq!(v["a"][1], "-Infinity");
        assert_eq!(v["a"][2], "Infinity");
        assert_eq!(v["NaN s"], "x NaN \" Infinity");
        assert!(matches!(quote_non_finite("[1, 2]"), Cow::Borrowed(_)));
        assert!(parse("[Nan]").is_err());
    }
}
