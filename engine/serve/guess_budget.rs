//! How many tokens a speculating sequence guesses next, adapted from how its guesses fared.
//!
//! A guess that is checked and dropped costs its row in the step: nearly nothing on a GPU at
//! batch 1, where the pass is bound by reading the weights, but most of a decode's work on a
//! CPU that computes each row. So the length follows the text: while guesses are kept it
//! grows back to the most asked for; a guess cut short sets it to what was kept and one more;
//! guesses that miss entirely pause guessing for a few steps, longer after each miss in a
//! row, so that text which does not repeat its input costs little.

/// Most steps a run of misses pauses guessing for.
const MAX_PAUSE: usize = 16;

/// The first guess's length, at most: a sequence's first guesses show whether its text
/// repeats; while they are kept the length doubles up to the most asked for. (On a CPU, where
/// a row costs a third of a decode, a first guess of 16 that missed cost the steps of 5.)
const FIRST: usize = 4;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuessBudget {
    /// The most tokens a step's guess may hold (the request's `speculate`); 0: none.
    pub most: usize,
    /// The length of the next guess.
    next: usize,
    /// Steps to wait before guessing again.
    pause: usize,
    /// Guesses in a row with nothing kept.
    misses: u32,
}

impl GuessBudget {
    pub fn new(most: usize) -> GuessBudget {
        GuessBudget {
            most,
            next: most.min(FIRST),
            pause: 0,
            misses: 0,
        }
    }

    /// How many tokens this step may guess (0 while paused; each call is a step).
    pub fn take(&mut self) -> usize {
        if self.pause > 0 {
            self.pause -= 1;
            return 0;
        }
        self.next
    }

    /// After a step checked `guessed` tokens and kept the first `kept`.
    pub fn record(&mut self, guessed: usize, kept: usize) {
        if guessed == 0 {
            return;
        }
        if kept == 0 {
            self.misses += 1;
            self.pause = (1usize << (self.misses - 1).min(8)).min(MAX_PAUSE);
            self.next = (self.next / 2).max(1);
            return;
        }
        self.misses = 0;
        self.next = match kept == guessed {
            true => (self.next * 2).min(self.most),
            false => (kept + 1).max(self.next / 2).min(self.most),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_guesses_grow_the_next_and_misses_pause() {
        let mut b = GuessBudget::new(8);
        assert_eq!(b.take(), 4, "a first guess of at most four");
        b.record(4, 4);
        assert_eq!(b.take(), 8, "all kept: doubled, up to the most");
        b.record(8, 3);
        assert_eq!(b.take(), 4, "what was kept and one more, or half");
        b.record(4, 4);
        assert_eq!(b.take(), 8, "all kept: doubled, up to the most");
        b.record(8, 0);
        assert_eq!((b.take(), b.take()), (0, 4), "one step's pause, then half");
        b.record(4, 0);
        assert_eq!((b.take(), b.take(), b.take()), (0, 0, 2));
        b.record(2, 1);
        assert_eq!(b.take(), 2, "a kept token ends the run of misses");
        b.record(2, 0);
        assert_eq!((b.take(), b.take()), (0, 1));
    }

    #[test]
    fn a_long_run_of_misses_pauses_at_most_sixteen_steps() {
        let mut b = GuessBudget::new(4);
        for _ in 0..40 {
            while b.take() == 0 {}
            b.record(1, 0);
        }
        let paused = std::iter::from_fn(|| Some(b.take()))
            .take_while(|&n| n == 0)
            .count();
        assert_eq!(paused, MAX_PAUSE);
        assert_eq!(GuessBudget::new(0).take(), 0);
    }
}
