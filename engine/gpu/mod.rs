//! The GPU backend: the kernels of `gpu-kernels/`, compiled to PTX by `build.rs`, loaded and
//! launched through `cudarc` (the driver API, found at run time, so nothing here needs CUDA
//! to build).
//!
//! - `context`: the device, its stream, and the loaded kernels
//! - `kernels`: the typed kernel table and one checked launch wrapper per kernel
//! - `launch`: the launch itself, with programmatic dependent launch where the GPU has it
//! - `backend`: weights, KV cache and activations on the device, and the forward pass

pub mod backend;
pub mod context;
pub mod kernels;
pub mod launch;

pub use backend::GpuBackend;
pub use context::Gpu;

/// The kernels, as PTX text for sm_80 and later (the driver compiles it when it loads).
pub const PTX_SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_sm_80.ptx"));
/// The same kernels for sm_90 and later, with programmatic dependent launch: each kernel
/// waits (`griddepcontrol.wait`) for the one before it, so the launch may start it early.
pub const PTX_SM90: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_sm_90.ptx"));

#[cfg(test)]
mod tests {
    #[test]
    fn ptx_holds_every_kernel_in_the_table() {
        for (ptx, target) in [(super::PTX_SM80, "sm_80"), (super::PTX_SM90, "sm_90")] {
            assert!(ptx.contains(&format!(".target {target}")));
            for name in super::kernels::Kernels::NAMES {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "{name} missing from the {target} PTX"
                );
            }
        }
        // Only the sm_90 build waits on the kernel before it.
        assert!(super::PTX_SM90.contains("griddepcontrol.wait"));
        assert!(!super::PTX_SM80.contains("griddepcontrol"));
    }
}
