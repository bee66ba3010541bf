//! Opening a GPU where there is none is a clear error, not a crash: the crate loads the
//! driver only when asked.

#[test]
fn opening_a_gpu_fails_clearly_without_a_driver_and_works_with_one() {
    match mica_cuda::Cuda::open(0) {
        Ok(g) => {
            assert!(mica_cuda::driver_present());
            assert!(!g.name().is_empty());
        }
        Err(e) => {
            let msg = e.to_string();
            if mica_cuda::driver_present() {
                // A driver without a usable device (or NVRTC) says which.
                assert!(!msg.is_empty());
            } else {
                assert!(matches!(e, mica_cuda::GpuError::NoDriver), "{e}");
                assert!(msg.contains("no CUDA driver"), "{msg}");
            }
        }
    }
}
