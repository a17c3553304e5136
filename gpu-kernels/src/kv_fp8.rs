// The fp8 KV cache's numbers (`--kv-dtype fp8`): how a head of keys or values becomes e4m3
// bytes and one scale, and back. No imports and no device intrinsics: the host compiles
// this same file too (`engine/kv_fp8.rs`, `include!`), so the CPU twins quantize and
// dequantize bit for bit as the kernels do.
//
// A (token, KV head) row of `head_dim` values is stored as `head_dim` e4m3 bytes and one
// scale byte: the scale is a power of two, 2^k with k the smallest integer for which the
// row's largest magnitude divided by 2^k is at most 448 (e4m3's largest finite value), kept
// as the byte `k + 127` (the exponent field of an f32, as OCP's E8M0 scales are). Why a
// power of two: multiplying by it is exact both ways, so the only rounding is e4m3's own (3
// mantissa bits, a relative error of at most 2^-4), and the stored value times the scale
// is exactly a bf16 (4 significant bits of 8): the attention kernels turn the bytes into
// bf16 tiles and run unchanged from there. Why a scale per row: a head's keys and its values
// differ in magnitude by orders between layers, heads and tokens (values are often ~0.01,
// where a fixed scale of 1 would leave e4m3 only its subnormals), and a scale written with
// the row needs no calibration and never has to change when later tokens arrive.

/// The scale byte's smallest value: k = -126, so that 2^k is a normal f32.
pub const KV_SCALE_MIN: u8 = 1;
/// The scale byte's largest value: k = 7, so that `kv_dequant_factor`'s 2^(k + 120) is a
/// finite f32. Rows larger than 448 * 2^7 = 57,344 saturate (no model's keys or values
/// come near).
pub const KV_SCALE_MAX: u8 = 134;

/// The scale byte of a row whose largest magnitude is `amax` (finite, >= 0): `k + 127` for
/// the smallest k with `amax / 2^k <= 448`, held to `KV_SCALE_MIN..=KV_SCALE_MAX`.
#[inline(always)]
pub fn kv_scale_of(amax: f32) -> u8 {
    let bits = amax.to_bits();
    let exponent = (bits >> 23) as i32; // biased: amax = 1.f * 2^(exponent - 127)
    // 448 = 1.75 * 2^8: a mantissa up to 1.75 fits under 448 * 2^(e - 127 - 8).
    let over = if bits & 0x7f_ffff <= 0x60_0000 { 8 } else { 7 };
    let s = exponent - over; // k + 127
    if s < KV_SCALE_MIN as i32 {
        KV_SCALE_MIN
    } else if s > KV_SCALE_MAX as i32 {
        KV_SCALE_MAX
    } else {
        s as u8
    }
}

/// What a row's values are multiplied by before rounding to e4m3: 2^-k.
#[inline(always)]
pub fn kv_quant_factor(scale: u8) -> f32 {
    f32::from_bits((254 - scale as u32) << 23)
}

/// What `kv_e4m3_bits_f32`'s value is multiplied by to give the stored value: 2^(k + 120).
#[inline(always)]
pub fn kv_dequant_factor(scale: u8) -> f32 {
    f32::from_bits((scale as u32 + 120) << 23)
}

/// The e4m3 byte's value times 2^-120, exactly: its sign, 4 exponent and 3 mantissa bits
/// moved into an f32's sign, the low 4 bits of its exponent and the top 3 of its mantissa.
/// e4m3's exponent bias is 7 and f32's 127, hence 2^-120; a subnormal e4m3 (exponent 0)
/// lands as a subnormal f32, by the same factor.
#[inline(always)]
pub fn kv_e4m3_bits_f32(byte: u32) -> f32 {
    f32::from_bits(((byte & 0x80) << 24) | ((byte & 0x7f) << 20))
}

/// `x` (a row's value times `kv_quant_factor`) rounded to e4m3, to the nearest and ties to
/// even, magnitudes past 448 held to 448: the byte `f32_to_e4m3` gives on the host, by
/// integer steps that the kernels and the twins share.
#[inline(always)]
pub fn kv_e4m3_of(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    let exponent = a >> 23;
    let code = if exponent >= 121 {
        // At least 2^-6, e4m3's smallest normal: keep 3 mantissa bits, rounding the 20
        // dropped ones to the nearest, ties to the even kept value (a carry moves into the
        // exponent, as it should), then rebias the exponent from 127 to 7.
        let rounded = (a + 0x7_ffff + ((a >> 20) & 1)) >> 20;
        let code = rounded - (120 << 3);
        if code > 0x7e { 0x7e } else { code }
    } else if exponent < 116 {
        // Below 2^-11: under a quarter of e4m3's smallest subnormal step, 2^-9.
        0
    } else {
        // A subnormal: x / 2^-9 rounded to an integer 0..=8 (8 is 2^-6, the first normal's
        // code). The 24-bit significand shifted right by 141 - exponent (21..=25).
        let significand = (a & 0x7f_ffff) | 0x80_0000;
        let shift = 141 - exponent;
        let q = significand >> shift;
        let rest = significand & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        if rest > half || (rest == half && q & 1 == 1) {
            q + 1
        } else {
            q
        }
    };
    sign | code as u8
}
