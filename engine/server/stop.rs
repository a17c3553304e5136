//! Stop strings over streamed text: text that may be the start of a stop string is held
//! back until it is known not to be; a stop string itself is never released.

/// One choice's stop strings and the text held back.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not released: its end may be the start of a stop string.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// `stops` must not contain an empty string (the request checks reject one).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        debug_assert!(stops.iter().all(|s| !s.is_empty()));
        StopMatcher {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// Takes the next piece of text. Returns the text that can be released now and whether
    /// a stop string was found: then what is released ends just before the earliest one, and
    /// everything after it is dropped (later calls release nothing).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.held.push_str(text);
        let hit = self.stops.iter().filter_map(|s| self.held.find(s)).min();
        if let Some(at) = hit {
            self.held.truncate(at);
            self.stopped = true;
            return (std::mem::take(&mut self.held), true);
        }
        // Hold the longest end of the text that begins some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|&n| s.is_char_boundary(n) && self.held.ends_with(&s[..n]))
                    .max()
            })
            .max()
            .unwrap_or(0);
        let release = self.held.len() - keep;
        let out = self.held[..release].to_owned();
        self.held.drain(..release);
        (out, false)
    }

    /// At the end of the text (no stop string completed): whatever was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `pieces` through a matcher: what was released, and whether it stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = vec![];
        for p in pieces {
            let (text, stopped) = m.push(p);
            out.push(text);
            if stopped {
                return (out, true);
            }
        }
        out.push(m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_over_pieces_is_held_back_and_never_sent() {
        let (out, stopped) = run(&["END"], &["Hello E", "N", "D and more"]);
        assert!(stopped);
        assert_eq!(out, ["Hello ", "", ""]);
        assert_eq!(out.concat(), "Hello ");
    }

    #[test]
    fn a_false_start_is_released_once_it_cannot_match() {
        let (out, stopped) = run(&["END"], &["a E", "N", "x", "b"]);
        assert!(!stopped);
        assert_eq!(out, ["a ", "", "ENx", "b", ""]);
        // held at the very end is released by finish
        let (out, stopped) = run(&["END"], &["a EN"]);
        assert!(!stopped);
        assert_eq!(out, ["a ", "EN"]);
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_text_after_it_is_dropped() {
        let (out, stopped) = run(&["bb", "\n\n", "xyz"], &["one\n\ntwo bb three"]);
        assert!(stopped);
        assert_eq!(out.concat(), "one");
        let (out, _) = run(&["ab", "b"], &["xab"]);
        assert_eq!(out.concat(), "x");
    }

    #[test]
    fn multibyte_stops_hold_back_only_on_char_boundaries() {
        let (out, stopped) = run(&["é!"], &["caf", "é", "?", "é", "!"]);
        assert!(stopped);
        assert_eq!(out, ["caf", "", "é?", "", ""]);
        let (out, stopped) = run(&[], &["anything"]);
        assert_eq!((out.concat(), stopped), ("anything".into(), false));
    }
}
