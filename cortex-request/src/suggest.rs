//! "Did you mean ...?": the known name closest to a misspelt one, for the
//! errors that name an unknown field, key or setting.

/// The candidate within two edits (letters inserted, deleted or changed)
/// of `given`, the closest first; `None` when none is that close.
///
/// ```
/// assert_eq!(cortex_request::closest_name("promt", ["prompt", "messages"]), Some("prompt"));
/// assert_eq!(cortex_request::closest_name("xyz", ["prompt", "messages"]), None);
/// ```
pub fn closest_name<'a>(
    given: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(given, candidate), candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, candidate)| candidate)
}

/// Letters to insert, delete or change to turn `a` into `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_are_counted_as_levenshtein_does() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("paralel", "parallel"), 1);
    }
}
