//! The GPU side, as far as it goes today: the PTX that `build.rs` compiled from
//! `gpu-kernels/`. The backend that loads and launches it (through `cudarc`) is next.

/// The kernels, as PTX text for sm_80 and later (the driver compiles it when it loads).
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

#[cfg(test)]
mod tests {
    #[test]
    fn ptx_holds_the_kernels() {
        assert!(super::PTX.contains(".target sm_80"));
        assert!(super::PTX.contains(".entry residual_add_f32"));
    }
}
