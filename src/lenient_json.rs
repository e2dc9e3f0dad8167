//! JSON as Python writes it: `json.dump` emits the bare literals `NaN`, `Infinity` and
//! `-Infinity`, which strict JSON parsers reject. [`parse`] turns each one (outside strings)
//! into the string `"NaN"` / `"Infinity"` / `"-Infinity"` that trmask's readers accept, and
//! parses the rest as ordinary JSON. A number beyond f64's range (`1e400`) reads as ±∞, as
//! Python's `json` reads it (strict parsers reject it).

use std::borrow::Cow;

/// Whether `b` needs rewriting: it holds an `N` or `I` (a bare `NaN` / `Infinity` may be
/// among them) or may hold a number literal beyond f64's range (an exponent of three or more
/// digits, or a run of more than 308 digits). One pass over the text.
fn needs_rewrite(b: &[u8]) -> bool {
    let mut run = 0usize;
    for (i, &c) in b.iter().enumerate() {
        if c == b'N' || c == b'I' {
            return true;
        }
        run = if c.is_ascii_digit() { run + 1 } else { 0 };
        if run > 308 {
            return true;
        }
        if c == b'e' || c == b'E' {
            let rest = &b[i + 1..];
            let rest = rest
                .strip_prefix(b"+")
                .or(rest.strip_prefix(b"-"))
                .unwrap_or(rest);
            if rest.len() >= 3 && rest[..3].iter().all(u8::is_ascii_digit) {
                return true;
            }
        }
    }
    false
}

/// The end of the JSON number literal starting at `i` (`-`? digits, fraction, exponent).
fn number_end(b: &[u8], mut i: usize) -> usize {
    let digits = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = digits(i);
    if b.get(i) == Some(&b'.') {
        i = digits(i + 1);
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        i = digits(i);
    }
    i
}

/// `text` with the bare non-finite literals quoted, and number literals beyond f64's range
/// replaced by the quoted infinity of their sign (borrowed when there are none).
pub fn quote_non_finite(text: &str) -> Cow<'_, str> {
    let b = text.as_bytes();
    if !needs_rewrite(b) {
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
        if c.is_ascii_digit() || (c == b'-' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            let end = number_end(b, i);
            if text[i..end].parse::<f64>().is_ok_and(f64::is_infinite) {
                out.push_str(&text[last..i]);
                out.push_str(if c == b'-' {
                    "\"-Infinity\""
                } else {
                    "\"Infinity\""
                });
                last = end;
            }
            i = end;
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
        // beyond f64's range: ±inf, as Python reads it; in range and inside strings: as is
        let v = parse(r#"{"a": [1e400, -2E+999, 1e308, 1e-400, 12], "s": "1e400"}"#).unwrap();
        assert_eq!(v["a"][0], "Infinity");
        assert_eq!(v["a"][1], "-Infinity");
        assert_eq!(v["a"][2], 1e308);
        assert_eq!(v["a"][3], 0.0);
        assert_eq!(v["a"][4], 12);
        assert_eq!(v["s"], "1e400");
        let long = format!("[{}]", "9".repeat(400));
        assert_eq!(parse(&long).unwrap()[0], "Infinity");
        assert!(parse("[Nan]").is_err());
    }
}
