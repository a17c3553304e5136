use super::*;
use crate::kv::block_manager::BLOCK_SIZE;

/// The phases' sums are the probe's over each phase's words, whatever lies between
/// the phases; every word is some block's, once.
#[cfg(feature = "probes")]
#[test]
fn read_phases_sums_each_phase_as_the_probe_does() {
    let data: Vec<u32> = (0..4 * 3000)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761))
        .collect();
    let (phase_vec4, phase_stride, grid) = (700, 1000, 3);
    let (mut phases, mut arrived) = (vec![0u32; grid], [0u32]);
    read_phases_u32(
        &mut phases,
        &mut arrived,
        &data,
        phase_vec4,
        phase_stride,
        3,
        0,
    );
    let mut expected = vec![0u32; grid];
    for p in 0..3 {
        let mut one = vec![0u32; grid];
        let from = 4 * p * phase_stride;
        read_probe_u32(&mut one, &data[from..from + 4 * phase_vec4]);
        for (e, o) in expected.iter_mut().zip(one) {
            *e = e.wrapping_add(o);
        }
    }
    assert_eq!(phases, expected);
    assert_eq!(arrived, [2 * grid as u32]);
    let in_phases = (0..3).flat_map(|p| &data[4 * p * phase_stride..][..4 * phase_vec4]);
    let all = in_phases.fold(0u32, |s, w| s.wrapping_add(*w));
    assert_eq!(phases.iter().fold(0u32, |s, w| s.wrapping_add(*w)), all);
}

/// The staged probe: every word is some block's once, an empty phase is nobody's, and
/// with a grid of at most 256 every block reads every block's sum of every phase but
/// the last.
#[cfg(feature = "probes")]
#[test]
fn staged_phases_read_every_word_and_every_sum() {
    let (tile_bytes, n_phases, grid) = (64, 3, 3);
    // Phases of 7, 0 and 14 tiles of 16 words.
    let starts = [0, 7, 7, 21];
    let data: Vec<u32> = (0..21 * 16)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761))
        .collect();
    let (mut partial, mut sums, mut arrived) = (vec![0u32; grid], vec![1u32; 6], [0u32]);
    read_phases_staged_u32(
        &mut partial,
        &mut sums,
        &mut arrived,
        &data,
        &starts,
        tile_bytes,
        n_phases,
        2,
        0,
    );
    let add = |words: &[u32]| words.iter().fold(0u32, |s, w| s.wrapping_add(*w));
    // Block 1 takes tiles 1 and 4 of phase 0: words 16..32 and 64..80.
    assert_eq!(sums[1], add(&data[16..32]).wrapping_add(add(&data[64..80])));
    assert_eq!(add(&sums[..3]), add(&data[..7 * 16]));
    assert_eq!(sums[3..], [0, 0, 0]);
    let expected = add(&data).wrapping_add(add(&data[..7 * 16]).wrapping_mul(grid as u32));
    assert_eq!(add(&partial), expected);
    assert_eq!(arrived, [2 * grid as u32]);
}

#[test]
fn rmsnorm_of_constant_row_is_weight() {
    let mut out = [0.0; 4];
    rmsnorm_f32(&mut out, &[3.0; 4], &[1.0, 2.0, 3.0, 4.0], 0.0);
    assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn matmul_one_and_many_tokens() {
    // w = [[1, 2], [3, 4], [5, 6]]: out = x w^T + b
    let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let mut one = [0.0; 3];
    matmul_f32(&mut one, &[1.0, 1.0], &w, Some(&[0.5, 0.0, -1.0]), 2);
    assert_eq!(one, [3.5, 7.0, 10.0]);
    let mut two = [0.0; 6];
    matmul_f32(&mut two, &[1.0, 0.0, 0.0, 2.0], &w, None, 2);
    assert_eq!(two, [1.0, 3.0, 5.0, 4.0, 8.0, 12.0]);
}

#[test]
fn rope_turns_pairs_by_the_angle() {
    // head_dim 4: pairs (0, 2) and (1, 3); position 1 at angles pi/2 and 0.
    let cos = [1.0, 1.0, 0.0, 1.0];
    let sin = [0.0, 0.0, 1.0, 0.0];
    let mut x = [1.0, 2.0, 3.0, 4.0];
    rope_f32(&mut x, &[1], &cos, &sin, 1, 4);
    assert_eq!(x, [-3.0, 2.0, 1.0, 4.0]);
}

#[test]
fn attention_weights_values_by_softmax_through_the_block_table() {
    // head_dim 1, one head, a sequence of two tokens living in block 1.
    let mut k_cache = vec![0.0; 2 * BLOCK_SIZE];
    let mut v_cache = vec![0.0; 2 * BLOCK_SIZE];
    kv_write_f32(
        &mut k_cache,
        &mut v_cache,
        &[0.0, 2.0f32.ln()],
        &[10.0, 20.0],
        &[16, 17],
        1,
    );
    let mut out = [0.0; 2];
    let p: PagedRef<f32> = Paged {
        q: &[1.0, 1.0],
        k_cache: &k_cache,
        v_cache: &v_cache,
        block_tables: &[1],
        token_seq: &[0, 0],
        positions: &[0, 1],
        shape: PagedShape::new(1, Heads::new(1, 1, 1)),
    };
    attention_f32(&mut out, &p);
    assert_eq!(out[0], 10.0, "the first token sees only itself");
    // scores 0 and ln 2: weights 1/3 and 2/3.
    assert!(
        (out[1] - (10.0 / 3.0 + 40.0 / 3.0)).abs() < 1e-5,
        "{}",
        out[1]
    );
}

/// Flash-decoding's twins over a sliding window: the splits (those wholly before a token's
/// window empty, one cut by it) combined give the one-pass attention over the same window,
/// which sees exactly the window's keys (a window of 1: the token's own value).
#[test]
fn split_attention_over_a_sliding_window_is_the_one_pass_attention() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(7);
    let (n_heads, n_kv_heads, head_dim) = (4, 2, 8);
    let kv_dim = n_kv_heads * head_dim;
    let blocks = 5;
    let mut bits = |n: usize| -> Vec<u16> {
        (0..n)
            .map(|_| half::bf16::from_f32(rng.random_range(-1.0..1.0)).to_bits())
            .collect()
    };
    let (k, v) = (
        bits(blocks * BLOCK_SIZE * kv_dim),
        bits(blocks * BLOCK_SIZE * kv_dim),
    );
    let q: Vec<f32> = (0..3 * n_heads * head_dim)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    // Blocks in reverse order; three tokens of one sequence.
    let tables: Vec<u32> = (0..blocks as u32).rev().collect();
    let positions = [0u32, 40, 77];
    for window in [None, Some(1), Some(10), Some(50)] {
        let p: PagedRef<u16> = Paged {
            q: &q,
            k_cache: &k,
            v_cache: &v,
            block_tables: &tables,
            token_seq: &[0, 0, 0],
            positions: &positions,
            shape: PagedShape::new(blocks, Heads::new(n_heads, n_kv_heads, head_dim))
                .windowed(window),
        };
        let mut one_pass = vec![0.0; q.len()];
        attention_bf16(&mut one_pass, &p);
        let (split_len, n_splits) = (16, blocks);
        let rows = 3 * n_heads * n_splits;
        let (mut po, mut ml) = (vec![f32::NAN; rows * head_dim], vec![f32::NAN; rows * 2]);
        attention_split_bf16(&mut po, &mut ml, &p, split_len);
        let mut combined = vec![0.0; q.len()];
        let splits = Splits::new(n_splits, split_len, head_dim);
        attention_combine_f32(&mut combined, &po, &ml, &positions, splits);
        for (a, b) in combined.iter().zip(&one_pass) {
            assert!((a - b).abs() < 1e-5, "window {window:?}: {a} vs {b}");
        }
        // Token 2 (position 77) over splits of 16: with a window of 10, splits 0 to 3 are
        // before it (empty), split 4 holds positions 68..=77.
        if window == Some(10) {
            let at = |s: usize| 2 * ((2 * n_heads) * n_splits + s);
            assert!((0..4).all(|s| ml[at(s)] == f32::NEG_INFINITY && ml[at(s) + 1] == 0.0));
            assert!(ml[at(4)].is_finite());
        }
        if window == Some(1) {
            // Each token's own value: position p lives in block table[p / 16].
            for (t, &pos) in positions.iter().enumerate() {
                let slot = tables[pos as usize / BLOCK_SIZE] as usize * BLOCK_SIZE
                    + pos as usize % BLOCK_SIZE;
                for h in 0..n_heads {
                    let value = &v[slot * kv_dim + (h / 2) * head_dim..][..head_dim];
                    let out = &one_pass[(t * n_heads + h) * head_dim..][..head_dim];
                    for (o, &b) in out.iter().zip(value) {
                        assert!((o - half::bf16::from_bits(b).to_f32()).abs() < 1e-6);
                    }
                }
            }
        }
    }
}

#[test]
fn swiglu_and_argmax() {
    let mut o = [0.0; 2];
    swiglu_f32(&mut o, &[0.0, 1.0], &[5.0, 2.0]);
    assert_eq!(o[0], 0.0);
    assert!((o[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-7);
    assert_eq!(argmax_f32(&[1.0, 3.0, 3.0, -1.0]), 1);
}
