//! How much of a model to stream to fit a memory budget.

use super::ring::{PAGE, layout};
use super::{MIN_HEAD_CHUNK, StreamMode, from_file};
use crate::error::{ModelError, Result};
use crate::memory::mib;
use crate::model::Model;
use crate::weights::Matrix;

/// What one layer costs in memory resident or streamed ([`layer_costs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerCost {
    /// Resident, as the model would hold it (repacked copies where they are made).
    pub resident: usize,
    /// What stays resident when it is streamed (matrices not read from the file: those
    /// rearranged at load).
    pub kept: usize,
    /// Bytes of its slot when streamed.
    pub slot: usize,
}

/// What streaming can save: each layer's [`LayerCost`] and the output head's (`None` when
/// it cannot be streamed: not read from the file as stored).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Costs {
    pub layers: Vec<LayerCost>,
    pub head: Option<LayerCost>,
}

/// The model's [`Costs`], for weights repacked or not.
pub fn layer_costs(model: &mut Model, repack: bool) -> Costs {
    let file = model.file.clone();
    let file_len = file.as_ref().map_or(0, |f| f.bytes().len());
    let held = |m: &Matrix| match m.repacked_len().filter(|_| repack || m.is_repacked()) {
        Some(n) => n,
        None => m.n_bytes(),
    };
    let layers = (0..model.layers.len())
        .map(|l| {
            let mut c = LayerCost::default();
            let mut ranges = Vec::new();
            for m in model.layer_matrices_mut(l) {
                let m: &Matrix = m;
                c.resident += held(m);
                match file.as_ref().filter(|f| from_file(m, f)) {
                    Some(_) => ranges.push((m.source().1, m.source().2)),
                    None => c.kept += held(m),
                }
            }
            c.slot = layout(&ranges, file_len).2;
            c
        })
        .collect();
    let w = &model.output.w;
    let head = file
        .as_ref()
        .filter(|f| from_file(w, f) && model.output.lora.is_empty())
        .map(|_| LayerCost {
            resident: held(w),
            kept: 0,
            slot: (w.n_bytes() + 2 * PAGE).min(MIN_HEAD_CHUNK),
        });
    Costs { layers, head }
}

/// What to stream so that the model fits in a memory budget ([`plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamPlan {
    /// The layers streamed (the last ones); empty when everything fits.
    pub streamed: Vec<usize>,
    /// The output head is streamed too (in chunks), when streaming every layer was not
    /// enough.
    pub head: bool,
    /// Bytes the plan keeps resident: everything not streamed, plus the ring's buffers.
    pub resident: usize,
    /// Bytes of the ring's buffers.
    pub ring: usize,
}

/// Streams as few of `model`'s last layers (and, when streaming every layer is not enough,
/// its output head) as make it fit in `budget` bytes, `total` being its memory estimate
/// fully resident: [`plan`], then [`super::start`] in `mode`. Returns the plan; nothing is
/// streamed when the model fits already. Call before repacking.
pub fn fit(
    model: &mut Model,
    repack: bool,
    total: usize,
    budget: usize,
    mode: StreamMode,
) -> Result<StreamPlan> {
    let costs = layer_costs(model, repack);
    let plan = plan(total, &costs, mode.slots(), budget)?;
    super::start(model, &plan.streamed, plan.head, mode)?;
    Ok(plan)
}

/// Keeps as much resident as `budget` allows — the output head and as many whole layers as
/// fit, or, when even streaming every layer is not enough, the layers that fit with the
/// head streamed — for a model that would need `total` bytes fully resident and whose
/// parts cost `costs`, streaming through `slots` buffers. An error with the numbers when
/// streaming everything still does not fit.
pub fn plan(total: usize, costs: &Costs, slots: usize, budget: usize) -> Result<StreamPlan> {
    let layers = &costs.layers;
    let n = layers.len();
    let head_resident = costs.head.map_or(0, |h| h.resident);
    let fixed =
        total.saturating_sub(layers.iter().map(|c| c.resident).sum::<usize>() + head_resident);
    // Streaming layers `k..` (and the head when `head`): (bytes resident, ring bytes).
    let cost = |k: usize, head: bool| -> (usize, usize) {
        let streamed = &layers[k..];
        // A streamed head is read in chunks: as many as the ring has slots, at least.
        let units = streamed.len() + if head { slots } else { 0 };
        let head = head.then_some(costs.head).flatten();
        let slot = streamed
            .iter()
            .chain(&head)
            .map(|c| c.slot)
            .max()
            .unwrap_or(0);
        let ring = slots.min(units) * slot;
        let kept = layers[..k].iter().map(|c| c.resident).sum::<usize>()
            + streamed.iter().map(|c| c.kept).sum::<usize>()
            + if head.is_some() { 0 } else { head_resident };
        (fixed + kept + ring, ring)
    };
    let heads: &[bool] = if costs.head.is_some() {
        &[false, true]
    } else {
        &[false]
    };
    for &head in heads {
        for k in (0..=n).rev() {
            let (need, ring) = cost(k, head);
            if need <= budget {
                return Ok(StreamPlan {
                    streamed: (k..n).collect(),
                    head,
                    resident: need,
                    ring,
                });
            }
        }
    }
    let head = costs.head.is_some();
    let (need, ring) = cost(0, head);
    let what = match head {
        true => "every layer and the output head",
        false => "every layer",
    };
    Err(ModelError::Streaming(format!(
        "a memory budget of {} is too small even with {what} streamed: the parts that stay \
         resident (embeddings, norms, KV cache, buffers, runtime{}) take {} and the ring of \
         {slots} buffer(s) {}, {} in all",
        mib(budget),
        if head { "" } else { ", output head" },
        mib(need - ring),
        mib(ring),
        mib(need)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_keeps_as_many_layers_as_fit() {
        const M: usize = 1 << 20;
        let c = LayerCost {
            resident: 100 * M,
            kept: 0,
            slot: 100 * M,
        };
        // Ten layers; fully resident 1600 MiB, 600 of them outside the layers.
        let costs = Costs {
            layers: vec![c; 10],
            head: None,
        };
        assert!(
            plan(1600 * M, &costs, 3, 1600 * M)
                .unwrap()
                .streamed
                .is_empty()
        );
        // Streaming k ≥ 3 layers saves k − 3 layers (a ring of three slots).
        let p = plan(1600 * M, &costs, 3, 1599 * M).unwrap();
        assert_eq!(
            (p.streamed, p.resident, p.ring),
            ((6..10).collect::<Vec<_>>(), 1500 * M, 300 * M)
        );
        let p = plan(1600 * M, &costs, 3, 1450 * M).unwrap();
        assert_eq!(p.streamed, (5..10).collect::<Vec<_>>());
        let p = plan(1600 * M, &costs, 3, 900 * M).unwrap();
        assert_eq!((p.streamed.len(), p.resident), (10, 900 * M));
        // One slot (sync): every layer streamed takes 600 + 100.
        let p = plan(1600 * M, &costs, 1, 700 * M).unwrap();
        assert_eq!((p.streamed.len(), p.ring), (10, 100 * M));
        // Layers not read from the file stay resident when streamed.
        let mut kept = costs.clone();
        kept.layers[9].kept = 40 * M;
        assert_eq!(
            plan(1600 * M, &kept, 1, 740 * M).unwrap().streamed.len(),
            10
        );
        assert!(plan(1600 * M, &kept, 1, 739 * M).is_err());
        let e = plan(1600 * M, &costs, 3, 899 * M).unwrap_err().to_string();
        assert!(
            e.contains("899.0 MiB is too small")
                && e.contains("take 600.0 MiB")
                && e.contains("ring of 3 buffer(s) 300.0 MiB, 900.0 MiB in all"),
            "{e}"
        );
    }

    #[test]
    fn plan_streams_the_head_only_when_every_layer_is_not_enough() {
        const M: usize = 1 << 20;
        let c = LayerCost {
            resident: 100 * M,
            kept: 0,
            slot: 100 * M,
        };
        // 600 fixed + ten layers of 100 + a head of 200 (chunks of 16).
        let costs = Costs {
            layers: vec![c; 10],
            head: Some(LayerCost {
                resident: 200 * M,
                kept: 0,
                slot: 16 * M,
            }),
        };
        let p = plan(1800 * M, &costs, 3, 1650 * M).unwrap();
        assert_eq!((p.streamed, p.head), ((5..10).collect::<Vec<_>>(), false));
        // Every layer streamed with the head resident takes 600 + 200 + 300.
        assert!(!plan(1800 * M, &costs, 3, 1100 * M).unwrap().head);
        // With the head streamed: 600 + k layers + 300.
        let p = plan(1800 * M, &costs, 3, 1099 * M).unwrap();
        assert_eq!(
            (p.streamed, p.head, p.resident),
            ((1..10).collect::<Vec<_>>(), true, 1000 * M)
        );
        let p = plan(1800 * M, &costs, 3, 999 * M).unwrap();
        assert_eq!((p.streamed.len(), p.head, p.resident), (10, true, 900 * M));
        let e = plan(1800 * M, &costs, 3, 899 * M).unwrap_err().to_string();
        assert!(
            e.contains("every layer and the output head streamed")
                && e.contains("900.0 MiB in all"),
            "{e}"
        );
    }
}
