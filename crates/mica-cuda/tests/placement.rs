//! Placement: `--gpu-layers` parsing, the device bytes `placement::footprint` predicts
//! against what the decoder allocates (counted on the emulator), and `plan`'s refusal of a
//! placement that does not fit, with the layer count that would.

mod common;
use common::emu::{EMU_MEMORY, Emu, EmuBuf, emu};
use common::hf::load;
use mica_cuda::placement::{GpuLayers, footprint, headroom, plan};
use mica_cuda::{GpuDecoder, GpuError, Launch, Result, Runner};
use std::cell::Cell;

/// The emulator, counting the bytes allocated and uploaded.
struct Counting {
    emu: &'static Emu,
    bytes: Cell<usize>,
}

impl Runner for Counting {
    type Buf = EmuBuf;
    fn alloc(&self, bytes: usize) -> Result<EmuBuf> {
        self.bytes.set(self.bytes.get() + bytes);
        self.emu.alloc(bytes)
    }
    fn upload(&self, data: &[u8]) -> Result<EmuBuf> {
        self.bytes.set(self.bytes.get() + data.len());
        self.emu.upload(data)
    }
    fn download(&self, buf: &EmuBuf) -> Result<Vec<u8>> {
        self.emu.download(buf)
    }
    fn launch(&self, name: &str, dims: Launch, params: &[u8]) -> Result<()> {
        self.emu.launch(name, dims, params)
    }
    fn memory(&self) -> Result<(usize, usize)> {
        self.emu.memory()
    }
}

#[test]
fn gpu_layers_parse() {
    assert_eq!("all".parse::<GpuLayers>(), Ok(GpuLayers::All));
    assert_eq!("-1".parse::<GpuLayers>(), Ok(GpuLayers::All));
    assert_eq!("12".parse::<GpuLayers>(), Ok(GpuLayers::Last(12)));
    let e = "twelve".parse::<GpuLayers>().unwrap_err();
    assert!(e.contains("not \"twelve\""), "{e}");
    assert_eq!(GpuLayers::Last(2).first(24), 22);
    assert_eq!(GpuLayers::Last(99).first(24), 0);
    assert_eq!(GpuLayers::All.first(24), 0);
}

/// What the decoder allocates when it loads is the footprint's weights and KV cache, byte
/// for byte; what one step of `max_tokens` tokens allocates is within its step buffers, and
/// a later step reuses the layers' buffers.
#[test]
fn the_footprint_is_what_the_decoder_allocates() {
    for (family, n_blocks) in [("llama", 8), ("gemma3", 5), ("qwen2", 3)] {
        let (model, _, _) = load(family);
        let n_layer = model.layers.len();
        for first in [0, 1, n_layer] {
            let r = Counting {
                emu: emu(),
                bytes: Cell::new(0),
            };
            let p = footprint(&model, first, n_blocks, 6);
            let mut dec = GpuDecoder::layers(&r, &model, first, n_blocks).unwrap();
            assert_eq!(
                r.bytes.get(),
                p.weights + p.kv,
                "{family} from layer {first}: weights and KV cache"
            );
            if first == n_layer {
                assert_eq!(p.kv, 0);
            }
            if first == 0 {
                r.bytes.set(0);
                let tables: &[&[u32]] = &[&[0]];
                let toks: Vec<u32> = (1..=6).collect();
                dec.forward(&toks, &[0, 1, 2, 3, 4, 5], &[0; 6], tables, &[true; 6])
                    .unwrap();
                let first_step = r.bytes.get();
                assert!(
                    first_step <= p.scratch,
                    "{family}: a step allocated {first_step} bytes, the footprint says {}",
                    p.scratch
                );
                // The layers' step buffers are kept: a step no larger allocates only its
                // inputs and outputs.
                r.bytes.set(0);
                dec.forward(&[7], &[6], &[0], tables, &[true]).unwrap();
                assert!(
                    r.bytes.get() * 4 < first_step,
                    "{family}: the next step allocated {} bytes again",
                    r.bytes.get()
                );
            }
        }
    }
}

#[test]
fn a_placement_that_does_not_fit_is_refused_with_one_that_does() {
    let (model, _, _) = load("llama");
    let n_layer = model.layers.len();
    let (n_blocks, tokens) = (64, 32);
    let all = footprint(&model, 0, n_blocks, tokens);
    let head = footprint(&model, n_layer, n_blocks, tokens);
    // Room for the head and one layer, not for all of them.
    let one = footprint(&model, n_layer - 1, n_blocks, tokens);
    assert!(head.total() < one.total() && one.total() < all.total());
    let free = one.total() + headroom(one.total()) + 1;
    let free = if one.total() <= free - headroom(free) {
        free
    } else {
        free * 2
    };
    assert!(
        all.total() > free - headroom(free),
        "the fixture is too small to test"
    );
    let e = plan(&model, GpuLayers::All, n_blocks, tokens, free).unwrap_err();
    assert!(matches!(e, GpuError::OutOfMemory(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("layers 0..2 (2 of 2)"), "{msg}");
    assert!(msg.contains("--gpu-layers 1 fits"), "{msg}");
    let p = plan(&model, GpuLayers::Last(1), n_blocks, tokens, free).unwrap();
    assert_eq!(p.first, n_layer - 1);
    // Nothing fits in no memory; everything fits in the emulator's.
    let e = plan(&model, GpuLayers::Last(1), n_blocks, tokens, 0).unwrap_err();
    assert!(e.to_string().contains("not even the output head"), "{e}");
    assert!(GpuDecoder::place(emu(), &model, GpuLayers::All, n_blocks, tokens).is_ok());
    assert!(all.total() < EMU_MEMORY);
}
