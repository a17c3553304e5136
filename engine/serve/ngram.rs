//! Guessing the next tokens from the text so far (prompt lookup): the last few tokens are
//! looked up earlier in the sequence, and the tokens that followed their latest earlier
//! occurrence are the guess. Free to make (no model), and right often where the output
//! repeats its input: a summary quoting its document, an edit of a function, a list
//! continued. The guess is checked by the model before any of it is kept
//! (`Engine::step`), so a wrong one costs only the rows it added to a step.

/// The longest and shortest run of last tokens looked up: a longer match is likelier to
/// continue the same way; one token alone still finds repeated names and code.
pub const MAX_MATCH: usize = 4;
pub const MIN_MATCH: usize = 1;

/// Up to `k` tokens guessed to follow `tokens`, into `out` (cleared first; empty when the
/// last tokens occur nowhere before). The longest match from `MAX_MATCH` down wins; among
/// equal matches, the latest.
pub fn propose(tokens: &[u32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    let n = tokens.len();
    if k == 0 || n < 2 {
        return;
    }
    for m in (MIN_MATCH..=MAX_MATCH.min(n - 1)).rev() {
        let tail = &tokens[n - m..];
        // Latest start first; a match must end before the tail begins, so that something
        // known follows it.
        if let Some(start) = (0..n - m).rev().find(|&s| &tokens[s..s + m] == tail) {
            let from = start + m;
            out.extend_from_slice(&tokens[from..(from + k).min(n)]);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guess(tokens: &[u32], k: usize) -> Vec<u32> {
        let mut out = vec![9, 9];
        propose(tokens, k, &mut out);
        out
    }

    #[test]
    fn the_latest_longest_match_gives_what_followed_it() {
        // "1 2 3" occurred at 0; the tail "2 3" and "3" too: the longest (3 tokens) wins.
        assert_eq!(guess(&[1, 2, 3, 4, 5, 7, 1, 2, 3], 3), vec![4, 5, 7]);
        // Two earlier "5 6": the later one's continuation.
        assert_eq!(guess(&[5, 6, 1, 5, 6, 2, 8, 5, 6], 2), vec![2, 8]);
        // Cut short by the end of what is known.
        assert_eq!(guess(&[4, 4], 5), vec![4]);
        assert_eq!(guess(&[1, 2, 1], 5), vec![2, 1]);
    }

    #[test]
    fn nothing_to_find_is_no_guess() {
        assert_eq!(guess(&[1, 2, 3], 4), Vec::<u32>::new());
        assert_eq!(guess(&[7], 4), Vec::<u32>::new());
        assert_eq!(guess(&[1, 2, 1], 0), Vec::<u32>::new());
    }
}
