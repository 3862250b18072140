//! Python-compatible text helpers.
//!
//! SGLang's messages embed Python renderings (`{x!r}`, list reprs,
//! `str.strip()`, `int()`), so reproducing them byte for byte needs these
//! small, exact equivalents.

/// Whether Python's `str.isspace()` holds for `c` (what `str.strip()` removes).
///
/// Rust's `char::is_whitespace` misses the four ASCII separators
/// U+001C..U+001F, which Python treats as whitespace.
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `s.strip()` with no arguments.
pub fn strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Python's `repr(s)` for a `str`.
///
/// Single quotes unless the text contains `'` and no `"`; backslash, the
/// chosen quote, `\t`, `\n`, `\r` are escaped; other non-printable
/// characters become `\xNN`, `\uNNNN` or `\UNNNNNNNN`.
pub fn repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
    out
}

/// An approximation of Python's `str.isprintable()` per character: control
/// characters, separators other than the ASCII space, and unassigned or
/// private-use code points are not printable. Exact for ASCII and Latin-1.
fn is_printable(c: char) -> bool {
    let u = c as u32;
    if u < 0x20 || (0x7f..0xa1).contains(&u) || u == 0xad {
        return false;
    }
    if c != ' ' && c.is_whitespace() {
        return false;
    }
    // Surrogates cannot occur in a Rust str; private use, noncharacters and
    // format characters are treated as non-printable like Python does.
    !matches!(u, 0xe000..=0xf8ff | 0xfff0..=0xffff | 0x200b..=0x200f | 0x2028..=0x202e | 0x2060..=0x206f | 0xfeff)
        && u < 0xf0000
}

/// Python's `repr(list_of_str)`: `['a', 'b']`, `[]` when empty.
pub fn repr_str_list<S: AsRef<str>>(items: &[S]) -> String {
    let parts: Vec<String> = items.iter().map(|s| repr_str(s.as_ref())).collect();
    format!("[{}]", parts.join(", "))
}

/// Python's `repr(list_of_int)`: `[0, 1]`.
pub fn repr_int_list(items: &[i64]) -> String {
    let parts: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Python's `int(text)` for base 10, limited to the `i64` range.
///
/// Accepts surrounding whitespace, one leading `+` or `-`, ASCII digits and
/// single `_` separators between digits. Returns `None` where Python raises
/// `ValueError` (and, unlike Python, for values outside `i64`; non-ASCII
/// decimal digits are also refused).
pub fn parse_int(text: &str) -> Option<i64> {
    let t = strip(text);
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || digits.starts_with('_') || digits.ends_with('_') || digits.contains("__") {
        return None;
    }
    let mut value: i128 = 0;
    for b in digits.bytes() {
        match b {
            b'_' => continue,
            b'0'..=b'9' => {
                value = value * 10 + i128::from(b - b'0');
                if value > i128::from(i64::MAX) + 1 {
                    return None;
                }
            }
            _ => return None,
        }
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

/// Python's `float(text)` for a string: surrounding whitespace, a sign,
/// decimal or exponent notation, `_` only between digits, and `inf`,
/// `infinity`, `nan` in any case. `None` where Python raises `ValueError`.
pub fn parse_float(text: &str) -> Option<f64> {
    let t = strip(text);
    let bytes = t.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'_' {
            let digit = |j: Option<usize>| j.and_then(|j| bytes.get(j)).is_some_and(u8::is_ascii_digit);
            if !digit(i.checked_sub(1)) || !digit(Some(i + 1)) {
                return None;
            }
        }
    }
    let cleaned: String = t.chars().filter(|c| *c != '_').collect();
    let body = cleaned.trim_start_matches(['+', '-']);
    if cleaned.len() - body.len() > 1 || body.is_empty() {
        return None;
    }
    let word = body.to_ascii_lowercase();
    if !matches!(word.as_str(), "inf" | "infinity" | "nan")
        && !body.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    cleaned.parse::<f64>().ok()
}

/// Python's `repr(float)`: the shortest text that reads back as the same
/// value, fixed notation for exponents -4..16 (`1.0`, `0.0001`), else
/// scientific with a signed two-digit exponent (`1e-05`, `1.5e+16`).
pub fn repr_float(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("LowerExp writes an exponent");
    let exp: i32 = exp.parse().expect("LowerExp writes a decimal exponent");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        if exp < 0 {
            return format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize));
        }
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            return format!("{sign}{digits}{}.0", "0".repeat(int_len - digits.len()));
        }
        return format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..]);
    }
    let rest = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
    format!("{sign}{}{rest}e{}{:02}", &digits[..1], if exp < 0 { '-' } else { '+' }, exp.abs())
}

/// Python's `json.dumps(obj, separators=(",", ":"))` for a string: ASCII
/// output (`ensure_ascii=True`), `\uXXXX` escapes (surrogate pairs above the
/// BMP), and the short escapes `\" \\ \n \r \t \b \f`.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (' '..='~').contains(&c) => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_matches_python() {
        assert_eq!(strip("  a b \t\n"), "a b");
        assert_eq!(strip("\u{1c}x\u{1f}"), "x");
        assert_eq!(strip("\u{a0}x\u{3000}"), "x");
        assert_eq!(strip(""), "");
    }

    #[test]
    fn repr_matches_python() {
        assert_eq!(repr_str("mori"), "'mori'");
        assert_eq!(repr_str("it's"), "\"it's\"");
        assert_eq!(repr_str("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(repr_str("a\\b\n"), "'a\\\\b\\n'");
        assert_eq!(repr_str("\u{1}\u{7f}é"), "'\\x01\\x7fé'");
        assert_eq!(repr_str(""), "''");
        assert_eq!(repr_str_list(&["mlx5_9", "x"]), "['mlx5_9', 'x']");
        assert_eq!(repr_str_list::<&str>(&[]), "[]");
        assert_eq!(repr_int_list(&[0, 1]), "[0, 1]");
    }

    #[test]
    fn int_matches_python() {
        assert_eq!(parse_int("42"), Some(42));
        assert_eq!(parse_int(" -7 "), Some(-7));
        assert_eq!(parse_int("+1_000"), Some(1000));
        assert_eq!(parse_int("007"), Some(7));
        assert_eq!(parse_int("-9223372036854775808"), Some(i64::MIN));
        for bad in ["", " ", "1_", "_1", "1__0", "0x10", "1.0", "--1", "9223372036854775808", "1 2"] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn float_matches_python() {
        for (text, want) in [
            ("1", 1.0),
            (" 0.5 ", 0.5),
            ("-1e-3", -0.001),
            ("1_0.2_5", 10.25),
            (".5", 0.5),
            ("5.", 5.0),
            ("+1E2", 100.0),
            ("Infinity", f64::INFINITY),
            ("-inf", f64::NEG_INFINITY),
        ] {
            assert_eq!(parse_float(text), Some(want), "{text:?}");
        }
        assert!(parse_float("NaN").unwrap().is_nan());
        for bad in ["", "_1", "1_", "1__0", "1._5", "0x1", "--1", "1 2", "infx", "1e", "e5", "+-1", "1,5"] {
            assert_eq!(parse_float(bad), None, "{bad:?}");
        }
        for (x, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-0.0, "-0.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (0.1 + 0.2, "0.30000000000000004"),
            (100.0, "100.0"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(repr_float(x), want, "{x}");
        }
    }

    #[test]
    fn json_string_is_ascii_compact() {
        assert_eq!(json_string("mlx5_0,mlx5_1"), "\"mlx5_0,mlx5_1\"");
        assert_eq!(json_string("é\"\\"), "\"\\u00e9\\\"\\\\\"");
        assert_eq!(json_string("😀"), "\"\\ud83d\\ude00\"");
    }
}
