//! The GPU backend: the kernels of `gpu-kernels/`, compiled to PTX by `build.rs`, loaded and
//! launched through `cudarc` (the driver API, found at run time, so nothing here needs CUDA
//! to build).
//!
//! - `context`: the device, its stream, and the loaded kernels
//! - `kernels`: the typed kernel table and one checked launch wrapper per kernel
//! - `backend`: weights, KV cache and activations on the device, and the forward pass

pub mod backend;
pub mod context;
pub mod kernels;

pub use backend::GpuBackend;
pub use context::Gpu;

/// The kernels, as PTX text for sm_80 and later (the driver compiles it when it loads).
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

#[cfg(test)]
mod tests {
    #[test]
    fn ptx_holds_every_kernel_in_the_table() {
        assert!(super::PTX.contains(".target sm_80"));
        for name in super::kernels::Kernels::NAMES {
            assert!(
                super::PTX.contains(&format!(".entry {name}(")),
                "{name} missing from the PTX"
            );
        }
    }
}
