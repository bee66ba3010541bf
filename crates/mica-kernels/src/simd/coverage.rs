//! Which tier's kernel fills each slot of each table: for every type, slot (the dot product,
//! each batch path's dot product, the matrix kernel of each path, the packed layout, the
//! activation quantizer) and tier, whether the tier has a kernel of its own there or keeps a
//! lower tier's. ggml writes this down by hand (`arch-fallback.h`); here it is read from the
//! tables the tiers' `install` functions build, whose every slot records the tier that
//! filled it, so it cannot drift from the code.

use std::fmt;

use super::{DotPath, Kernels, Tier, kernels, mat_slot, slot};
use crate::DType;

/// A slot of a kernel table, per type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The dot product, `vec_dot` ([`Kernels::vec_dot`]).
    Dot,
    /// The dot product of a batch path ([`Kernels::dot_fn`]; never `DotPath::VecDot`, whose
    /// kernel is `Dot`).
    PathDot(DotPath),
    /// The matrix kernel of a path ([`Kernels::matmul`]).
    Mat(DotPath),
    /// The load-time packed layout and its matrix kernel ([`Kernels::pack`]).
    Packed,
    /// The activation quantizer ([`Kernels::quantize_act`]).
    Quantize,
}

impl Slot {
    /// Every slot, in listing order.
    pub const ALL: [Slot; 12] = [
        Slot::Dot,
        Slot::PathDot(DotPath::RepackGemv),
        Slot::PathDot(DotPath::RepackGemm),
        Slot::PathDot(DotPath::Tiled),
        Slot::PathDot(DotPath::PerBlock),
        Slot::Mat(DotPath::VecDot),
        Slot::Mat(DotPath::RepackGemv),
        Slot::Mat(DotPath::RepackGemm),
        Slot::Mat(DotPath::Tiled),
        Slot::Mat(DotPath::PerBlock),
        Slot::Packed,
        Slot::Quantize,
    ];
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slot::Dot => f.pad("dot"),
            Slot::PathDot(p) => f.pad(&format!("dot/{p:?}")),
            Slot::Mat(p) => f.pad(&format!("mat/{p:?}")),
            Slot::Packed => f.pad("packed"),
            Slot::Quantize => f.pad("quantize"),
        }
    }
}

/// What one tier's table holds in one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cell {
    /// A kernel of the tier itself.
    Own,
    /// The kernel of this lower tier, kept from the table the tier extends.
    FallsBack(Tier),
    /// No kernel, in this tier or below: a matrix product then runs one dot per output, a
    /// batch path takes the plain dot product, weights have no packed layout; an empty `Dot`
    /// is an activation-only type.
    Empty,
    /// This build does not have the tier (its kernels are another architecture's).
    NotBuilt,
}

impl Cell {
    /// Whether the table runs a kernel in this slot (its own or a lower tier's).
    pub fn has_kernel(self) -> bool {
        matches!(self, Cell::Own | Cell::FallsBack(_))
    }
}

/// One tier as this build and this CPU see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierStatus {
    pub tier: Tier,
    /// Whether this build has the tier's kernels.
    pub built: bool,
    /// Whether this CPU can run them.
    pub supported: bool,
    /// Whether it is the table mica runs on this CPU ([`kernels`]).
    pub selected: bool,
}

/// One type and slot across the tiers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub dtype: DType,
    pub slot: Slot,
    /// By tier, in [`Tier::ALL`]'s order.
    pub cells: [Cell; Tier::ALL.len()],
}

/// The kernel coverage of every tier ([`coverage()`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coverage {
    /// In [`Tier::ALL`]'s order.
    pub tiers: [TierStatus; Tier::ALL.len()],
    /// Every weight type (and activation-only type) with every slot but `Quantize`; the
    /// `Quantize` slot of the types activations are quantized to (some weight type's
    /// `vec_dot_type()`).
    pub rows: Vec<Row>,
}

impl Coverage {
    /// What `tier`'s table holds for `t` in `slot` (`None` for a (type, slot) not listed).
    pub fn cell(&self, t: DType, slot: Slot, tier: Tier) -> Option<Cell> {
        self.rows
            .iter()
            .find(|r| r.dtype == t && r.slot == slot)
            .map(|r| r.cells[tier as usize])
    }

    /// The tier mica runs on this CPU.
    pub fn selected(&self) -> Tier {
        self.tiers
            .iter()
            .find(|s| s.selected)
            .map_or(Tier::Scalar, |s| s.tier)
    }
}

/// The kernel coverage of every tier, from the tables their `install` functions build (every
/// tier this build has, including the ones this CPU cannot run: their tables are built and
/// read, never called), with the tier selected on this CPU.
pub fn coverage() -> Coverage {
    let tables = Tier::ALL.map(Kernels::build);
    let selected = kernels().tier();
    let tiers = Tier::ALL.map(|tier| TierStatus {
        tier,
        built: tier.built(),
        supported: tier.supported(),
        selected: tier == selected,
    });
    let activation = |t: DType| DType::WEIGHT_TYPES.iter().any(|w| w.vec_dot_type() == t);
    let mut rows = Vec::new();
    for t in DType::ALL {
        for s in Slot::ALL {
            if s == Slot::Quantize && !activation(t) {
                continue;
            }
            let cells = Tier::ALL.map(|tier| match &tables[tier as usize] {
                None => Cell::NotBuilt,
                Some(k) => match k.origin_of(t, s) {
                    None => Cell::Empty,
                    Some(o) if o == tier => Cell::Own,
                    Some(o) => Cell::FallsBack(o),
                },
            });
            rows.push(Row {
                dtype: t,
                slot: s,
                cells,
            });
        }
    }
    Coverage { tiers, rows }
}

impl Kernels {
    /// The tier that filled slot `s` of type `t` in this table (`None`: empty).
    fn origin_of(&self, t: DType, s: Slot) -> Option<Tier> {
        let o = &self.origin;
        match s {
            Slot::Dot => o.dot[slot(t)],
            Slot::PathDot(p) => p.slot().and_then(|p| o.paths[p][slot(t)]),
            Slot::Mat(p) => o.mats[mat_slot(p)][slot(t)],
            Slot::Packed => o.packed[slot(t)],
            Slot::Quantize => o.quant[slot(t)],
        }
    }
}

impl fmt::Display for Coverage {
    /// The tiers, then one line per (type, slot) with a kernel in some tier: per built tier
    /// "own", the lower tier whose kernel it keeps, or "-" (none).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "CPU kernel tiers (each extends the one before it; neon extends scalar):"
        )?;
        for s in &self.tiers {
            let status = match (s.built, s.supported) {
                (false, _) => "not built (another architecture's)",
                (true, false) => "built; this CPU cannot run it",
                (true, true) => "built; this CPU runs it",
            };
            let sel = if s.selected {
                "  <- selected at run time"
            } else {
                ""
            };
            writeln!(f, "  {:<8} {status}{sel}", s.tier.name())?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "Per type and slot, the kernel each tier's table runs: \"own\" its own, a tier \
             name the one it keeps from that lower tier,\n\"-\" none (mat: one dot per output; \
             dot/<path>: the plain dot; packed: no packed layout). * = selected."
        )?;
        let built: Vec<&TierStatus> = self.tiers.iter().filter(|s| s.built).collect();
        let mut line = format!("{:<8}{:<17}", "type", "slot");
        for s in &built {
            let name = format!("{}{}", s.tier.name(), if s.selected { "*" } else { "" });
            line += &format!("{name:<9}");
        }
        writeln!(f, "{}", line.trim_end())?;
        for r in &self.rows {
            if !r.cells.iter().any(|c| c.has_kernel()) {
                continue;
            }
            let mut line = format!("{:<8}{:<17}", r.dtype.to_string(), r.slot);
            for s in &built {
                let cell = match r.cells[s.tier as usize] {
                    Cell::Own => "own",
                    Cell::FallsBack(t) => t.name(),
                    Cell::Empty | Cell::NotBuilt => "-",
                };
                line += &format!("{cell:<9}");
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address of whatever fills slot `s` of `t` in `k` (`None`: empty), to check the
    /// recorded origins against the tables' contents.
    fn address(k: &Kernels, t: DType, s: Slot) -> Option<usize> {
        let i = slot(t);
        match s {
            Slot::Dot => (k.origin.dot[i].is_some()).then_some(k.dot[i] as usize),
            Slot::PathDot(p) => p.slot().and_then(|p| k.paths[p][i]).map(|f| f as usize),
            Slot::Mat(p) => k.mats[mat_slot(p)][i].map(|f| f as usize),
            Slot::Packed => k.packed[i].map(|p| p.mat as usize),
            Slot::Quantize => (k.origin.quant[i].is_some()).then_some(k.quant[i] as usize),
        }
    }

    /// Every slot's recorded origin matches what the slot holds, in every table this build
    /// has (built without calling a kernel, so on any CPU): empty where no tier filled it,
    /// the very function of the lower tier it claims to fall back to, and a function other
    /// than its base tier's where it claims its own.
    #[test]
    fn origins_match_the_tables() {
        let tables = Tier::ALL.map(Kernels::build);
        let mut checked = 0;
        for tier in Tier::ALL {
            let Some(k) = &tables[tier as usize] else {
                assert!(!tier.built(), "{tier} is built but has no table");
                continue;
            };
            assert_eq!(k.tier, tier);
            for t in DType::ALL {
                for s in Slot::ALL {
                    let here = address(k, t, s);
                    match k.origin_of(t, s) {
                        None => assert_eq!(here, None, "{tier} {t} {s}: empty slot holds a kernel"),
                        Some(o) if o == tier => {
                            let base = tier.base().and_then(|b| tables[b as usize].as_ref());
                            if let Some(base) = base {
                                assert_ne!(
                                    here,
                                    address(base, t, s),
                                    "{tier} {t} {s}: its own kernel is its base's"
                                );
                            }
                            assert!(here.is_some(), "{tier} {t} {s}: own but empty");
                        }
                        Some(o) => {
                            let lower = tables[o as usize].as_ref().expect("the lower table");
                            assert_eq!(lower.origin_of(t, s), Some(o), "{tier} {t} {s}");
                            assert_eq!(
                                here,
                                address(lower, t, s),
                                "{tier} {t} {s}: not {o}'s kernel"
                            );
                        }
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked >= DType::ALL.len() * Slot::ALL.len());
    }

    /// A tier that fills one slot twice fails while building its table (each kernel is
    /// listed once in its `install`).
    #[test]
    #[should_panic(expected = "installs two kernels in one slot")]
    fn a_slot_is_filled_once_per_tier() {
        let mut k = Kernels::build(Tier::Scalar).expect("scalar");
        k.set_dot(DType::Q4_0, |_, _, _| 0.0);
    }
}
