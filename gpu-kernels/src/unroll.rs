//! `unroll!`: a loop over a constant range written out as copies of its body.

/// `i = 0, 1, ..., n - 1` (n at most 16) as that many copies of the body, `i` a constant in
/// each: `mma` fragments are arrays of registers, and a loop the compiler kept rolled
/// would index them through local memory.
macro_rules! unroll {
    ($i:ident < $n:expr => $body:block) => {
        unroll!(@ $i, $n, $body, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15])
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
