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
    fn json_string_is_ascii_compact() {
        assert_eq!(json_string("mlx5_0,mlx5_1"), "\"mlx5_0,mlx5_1\"");
        assert_eq!(json_string("é\"\\"), "\"\\u00e9\\\"\\\\\"");
        assert_eq!(json_string("😀"), "\"\\ud83d\\ude00\"");
    }
}
