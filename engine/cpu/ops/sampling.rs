//! The sampling kernels' twins: `argmax_f32`, `sample_f32`, `penalize_f32` and
//! `mask_logits_f32`, with the packing of a row's parameters and the random bits of each draw
//! (`hash32`, which the weights' generator `fill_random_bf16` uses too), in the GPU's integer
//! arithmetic.

/// Index of the largest logit (the first, on a tie). Greedy decoding.
///
/// - `logits`: `[vocab]`
pub fn argmax_f32(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The "lowbias32" mixer the GPU generator uses.
pub fn hash32(seed: u32, i: u32) -> u32 {
    let mut x = i ^ seed.wrapping_mul(0x9e37_79b9);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Words of a row's parameters for `sample_f32`: temperature, top_p and min_p (f32 bits),
/// top_k, and the request's seed as two halves.
pub const SAMPLE_PARAMS: usize = 6;

/// One row's `sample_f32` parameters, packed.
pub fn sample_params(
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    seed: u64,
) -> [u32; 6] {
    [
        temperature.to_bits(),
        top_p.to_bits(),
        min_p.to_bits(),
        top_k.min(u32::MAX as usize) as u32,
        seed as u32,
        (seed >> 32) as u32,
    ]
}

/// The random 32 bits of draw `step` of a request seeded `(seed_lo, seed_hi)`: the twin of
/// the kernels' `draw_bits`.
pub fn draw_bits(seed_lo: u32, seed_hi: u32, step: u32) -> u32 {
    hash32(seed_lo ^ hash32(seed_hi, 0x5eed_5eed), step)
}

/// For each row, a token drawn from its logits by its parameters, in the same integer
/// arithmetic as the GPU: the twin of `sample_f32` (see its header). Weights are
/// `2^((l - max) log2(e) / T)` in f32, then `floor(w 2^24)`; everything after is exact.
///
/// - `out`: `[rows]`
/// - `logits`: `[rows, vocab]`
/// - `params`: `[rows, SAMPLE_PARAMS]` (`sample_params`); `steps`: `[rows]`
pub fn sample_f32(out: &mut [u32], logits: &[f32], params: &[u32], steps: &[u32], vocab: usize) {
    let key = |x: f32| {
        let b = x.to_bits();
        if b >> 31 == 1 { !b } else { b | 0x8000_0000 }
    };
    let fixed = |w: f32| (w * 16_777_216.0) as u64;
    for (r, o) in out.iter_mut().enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let p = &params[r * SAMPLE_PARAMS..(r + 1) * SAMPLE_PARAMS];
        let (temperature, top_p, min_p) = (
            f32::from_bits(p[0]),
            f32::from_bits(p[1]),
            f32::from_bits(p[2]),
        );
        let top_k = p[3] as usize;
        let best_i = argmax_f32(row) as usize;
        if temperature == 0.0 {
            *o = best_i as u32;
            continue;
        }
        let best = row[best_i];
        let scale = std::f32::consts::LOG2_E / temperature;
        let weight = |l: f32| ((l - best) * scale).exp2();
        // The largest key with at least `count` of the row at or above it, for a predicate
        // that falls as the key rises: the kernel's bit-by-bit search.
        let search = |ok: &dyn Fn(u32) -> bool| {
            let mut found = 0u32;
            for bit in (0..32).rev() {
                let cand = found | (1 << bit);
                if ok(cand) {
                    found = cand;
                }
            }
            found
        };
        let k_key = if top_k > 0 && top_k < vocab {
            search(&|cand| row.iter().filter(|&&l| key(l) >= cand).count() >= top_k)
        } else {
            0
        };
        let kept_sum = |from: u32| -> u64 {
            row.iter()
                .filter(|&&l| key(l) >= from)
                .map(|&l| fixed(weight(l)))
                .sum()
        };
        let p_key = if top_p < 1.0 {
            let total = kept_sum(k_key);
            let need = (total as u128 * fixed(top_p) as u128).div_ceil(1 << 24) as u64;
            search(&|cand| kept_sum(cand) >= need)
        } else {
            k_key
        };
        let keep = |l: f32| key(l) >= p_key && weight(l) >= min_p;
        let total: u64 = row
            .iter()
            .filter(|&&l| keep(l))
            .map(|&l| fixed(weight(l)))
            .sum();
        let bits = draw_bits(p[4], p[5], steps[r]);
        let target = ((total as u128 * bits as u128) >> 32) as u64;
        let mut at = 0u64;
        for (i, &l) in row.iter().enumerate() {
            if keep(l) {
                at += fixed(weight(l));
                if target < at {
                    *o = i as u32;
                    break;
                }
            }
        }
    }
}

/// The penalties, in place, for each `(row, token, times generated | in prompt << 31)` entry:
/// the twin of `penalize_f32`.
///
/// - `logits`: `[rows, vocab]`
/// - `entries`: `[n, 3]`
/// - `penalties`: `[rows, 3]`: repeat, presence, frequency
pub fn penalize_f32(logits: &mut [f32], entries: &[u32], penalties: &[f32], vocab: usize) {
    for e in entries.chunks_exact(3) {
        let (r, token, counts) = (e[0] as usize, e[1] as usize, e[2]);
        let (generated, in_prompt) = (counts & 0x7fff_ffff, counts >> 31 == 1);
        let (repeat, presence, frequency) =
            (penalties[3 * r], penalties[3 * r + 1], penalties[3 * r + 2]);
        let l = &mut logits[r * vocab + token];
        if in_prompt || generated > 0 {
            *l = if *l > 0.0 { *l / repeat } else { *l * repeat };
        }
        if generated > 0 {
            *l -= presence + frequency * generated as f32;
        }
    }
}

/// Grammar masks, in place: in each masked row every token whose bit is clear becomes -inf;
/// the twin of `mask_logits_f32`.
///
/// - `logits`: `[rows, vocab]`
/// - `masks`: `[n, ceil(vocab / 32)]`, bit `t % 32` of word `t / 32` set: token `t` allowed
/// - `mask_rows`: `[n]`, the row each mask applies to
pub fn mask_logits_f32(logits: &mut [f32], masks: &[u32], mask_rows: &[u32], vocab: usize) {
    let words = vocab.div_ceil(32);
    for (mask, &r) in masks.chunks_exact(words).zip(mask_rows) {
        let row = &mut logits[r as usize * vocab..(r as usize + 1) * vocab];
        for (t, l) in row.iter_mut().enumerate() {
            if (mask[t / 32] >> (t % 32)) & 1 == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(logits: &[f32], p: [u32; 6], n: u32) -> Vec<usize> {
        let mut counts = vec![0; logits.len()];
        for step in 0..n {
            let mut out = [0u32];
            sample_f32(&mut out, logits, &p, &[step], logits.len());
            counts[out[0] as usize] += 1;
        }
        counts
    }

    #[test]
    fn draws_follow_the_softmax() {
        let logits = [1.0f32, 2.0, 0.5, -1.0, 3.0, 0.0, 2.5, -3.0];
        let n = 40_000;
        let counts = draws(&logits, sample_params(1.0, 0, 1.0, 0.0, 7), n);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let want = logits[i].exp() / z;
            let got = c as f32 / n as f32;
            assert!((got - want).abs() < 0.01, "token {i}: {got} against {want}");
        }
    }

    #[test]
    fn filters_keep_what_they_say() {
        let logits = [1.0f32, 2.0, 0.5, -1.0, 3.0, 0.0, 2.5, -3.0];
        // Top-2: tokens 4 and 6 alone.
        let c = draws(&logits, sample_params(1.0, 2, 1.0, 0.0, 1), 2000);
        assert!(
            c.iter()
                .enumerate()
                .all(|(i, &n)| n == 0 || i == 4 || i == 6),
            "{c:?}"
        );
        assert!(c[4] > 0 && c[6] > 0);
        // Top-p 0.5: token 4 alone holds 0.46 of the mass, with 6 it is past 0.5.
        let c = draws(&logits, sample_params(1.0, 0, 0.5, 0.0, 2), 2000);
        assert!(
            c.iter()
                .enumerate()
                .all(|(i, &n)| n == 0 || i == 4 || i == 6),
            "{c:?}"
        );
        // Min-p 0.5: weights e^(l - 3) >= 0.5 keep tokens 4 (1.0) and 6 (0.61).
        let c = draws(&logits, sample_params(1.0, 0, 1.0, 0.5, 3), 2000);
        assert!(
            c.iter()
                .enumerate()
                .all(|(i, &n)| n == 0 || i == 4 || i == 6),
            "{c:?}"
        );
        // Greedy, and top-k 1: the largest.
        assert_eq!(
            draws(&logits, sample_params(0.0, 0, 1.0, 0.0, 4), 10)[4],
            10
        );
        assert_eq!(
            draws(&logits, sample_params(0.7, 1, 1.0, 0.0, 5), 10)[4],
            10
        );
    }

    #[test]
    fn a_seed_and_step_give_the_same_draw_and_others_differ() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 25.0).collect();
        let one = |seed, step| {
            let mut out = [0u32];
            sample_f32(
                &mut out,
                &logits,
                &sample_params(1.0, 0, 1.0, 0.0, seed),
                &[step],
                1000,
            );
            out[0]
        };
        assert_eq!(one(9, 3), one(9, 3));
        let differ = (0..20).filter(|&s| one(9, s) != one(10, s)).count();
        assert!(
            differ > 10,
            "seeds 9 and 10 drew the same {} times of 20",
            20 - differ
        );
    }

    #[test]
    fn penalties_as_documented() {
        let mut l = vec![2.0f32, -2.0, 1.0, 1.0];
        // token 0: in the prompt only; 1: generated twice; 2: untouched; 3: generated once.
        let entries = [0, 0, 1 << 31, 0, 1, 2, 0, 3, 1];
        penalize_f32(&mut l, &entries, &[2.0, 0.5, 0.25], 4);
        assert_eq!(l, vec![1.0, -4.0 - 0.5 - 0.5, 1.0, 0.5 - 0.5 - 0.25]);
    }
}
