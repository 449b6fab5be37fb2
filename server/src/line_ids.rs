//! Reading request ids out of host lines that are not valid JSON (a number out of range, a
//! UTF-8 byte order mark, a truncated line, nesting deeper than serde_json's limit, ...), so
//! the engine can answer such a request with a `done` instead of leaving the host waiting.
//!
//! A lenient scan, not a parser: it walks the text keeping only the bracket depth and string
//! boundaries, and takes the integer value of every `"id"` key directly inside a top-level
//! object (the last one if an object repeats it, as serde_json does). It never fails and never
//! recurses, whatever the input.

/// The ids of the top-level objects in `text`, in order (an object cut off at the end of the
/// text counts too).
pub fn scan_ids(text: &str) -> Vec<u64> {
    let b = text.as_bytes();
    let mut ids = Vec::new();
    let mut depth = 0usize;
    // Depth 1 is a top-level object (not an array), and the next string there is a key.
    let mut in_object = false;
    let mut expect_key = false;
    let mut current: Option<u64> = None;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let start = i + 1;
                i = string_end(b, start);
                let is_key = depth == 1 && in_object && expect_key;
                if is_key {
                    expect_key = false;
                    if &b[start..i.min(b.len())] == b"id"
                        && let Some((id, end)) = id_value(b, i + 1)
                    {
                        current = Some(id);
                        i = end;
                        continue;
                    }
                }
            }
            open @ (b'{' | b'[') => {
                depth += 1;
                if depth == 1 {
                    in_object = open == b'{';
                    expect_key = in_object;
                    current = None;
                }
            }
            b'}' | b']' => {
                if depth == 1 && in_object {
                    ids.extend(current.take());
                }
                depth = depth.saturating_sub(1);
            }
            b',' if depth == 1 => expect_key = in_object,
            _ => {}
        }
        i += 1;
    }
    if depth >= 1 && in_object {
        ids.extend(current);
    }
    ids
}

/// Index of the closing quote of the string whose contents start at `start` (or `b.len()`).
fn string_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i,
            _ => i += 1,
        }
    }
    b.len()
}

/// After a key's closing quote at `i - 1`: `: <integer>` followed by a delimiter gives the
/// integer and the index after it. Anything else (a float, a negative number, a string, an
/// integer past `u64::MAX`) is no readable id.
fn id_value(b: &[u8], mut i: usize) -> Option<(u64, usize)> {
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    i = skip_ws(i);
    if b.get(i) != Some(&b':') {
        return None;
    }
    i = skip_ws(i + 1);
    let start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == start || (b[start] == b'0' && i - start > 1) {
        return None;
    }
    match b.get(skip_ws(i)) {
        None | Some(b',' | b'}') => {}
        Some(_) => return None,
    }
    let id = std::str::from_utf8(&b[start..i]).ok()?.parse().ok()?;
    Some((id, i))
}

#[cfg(test)]
mod tests {
    use super::scan_ids;

    #[test]
    fn ids_of_broken_lines() {
        let bom = "\u{feff}{\"type\":\"generate\",\"id\":5,\"tokens\":[1],\"max_tokens\":1}";
        assert_eq!(scan_ids(bom), vec![5]);
        assert_eq!(scan_ids(r#"{"type":"generate","id":7,"max_tokens":1e999}"#), vec![7]);
        assert_eq!(scan_ids(r#"{"id": 3 , "tokens":[1,"#), vec![3], "cut off");
        assert_eq!(scan_ids(r#"{"id":1,"id":2}"#), vec![2], "the last one, as serde_json");
        assert_eq!(scan_ids(r#"{"a":{"id":4}} {"id":6}x"#), vec![6], "top level only");
        assert_eq!(scan_ids(r#"{"s":"\"id\":9","id":8}"#), vec![8], "strings skipped");
        assert_eq!(scan_ids(r#"{"x":"id","id":10}"#), vec![10], "a value is no key");
        for none in [
            r#"{"id":-1}"#,
            r#"{"id":1.5}"#,
            r#"{"id":1e3}"#,
            r#"{"id":"1"}"#,
            r#"{"id":01}"#,
            r#"{"id":18446744073709551616}"#,
            r#"["id",1]"#,
            "not json",
            "",
        ] {
            assert!(scan_ids(none).is_empty(), "{none}");
        }
        let deep = format!("{{\"id\":11,\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(scan_ids(&deep), vec![11]);
    }
}
