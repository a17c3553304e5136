//! `unroll!`: a loop over a constant range written out as copies of its body.

/// `i = 0, 1, ..., n - 1` (n at most 32) as that many copies of the body, `i` a constant in
/// each: `mma` fragments are arrays of registers, and a loop the compiler kept rolled
/// would index them through local memory.
macro_rules! unroll {
    // A count written as 2, 4 or 8 gets that many copies, not 32 to fold away: nested
    // loops multiply their copies, and three deep at 32 the kernels' build ran out of memory.
    ($i:ident < 2 => $body:block) => {
        unroll!(@ $i, 2, $body, [0 1])
    };
    ($i:ident < 4 => $body:block) => {
        unroll!(@ $i, 4, $body, [0 1 2 3])
    };
    ($i:ident < 8 => $body:block) => {
        unroll!(@ $i, 8, $body, [0 1 2 3 4 5 6 7])
    };
    ($i:ident < $n:expr => $body:block) => {
        unroll!(@ $i, $n, $body, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31])
    };
    (@ $i:ident, $n:expr, $body:block, [$($k:literal)*]) => {
        $(
            if $k < $n {
                let $i: usize = $k;
                $body
            }
        )*
    };
}

pub(crate) use unroll;
