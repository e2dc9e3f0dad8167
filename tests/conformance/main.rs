//! Conformance: verl goldens and fuzz, the distributed merge, corrections, KPop, top-K, OPSM, M2PO, CPPO, kept mass, kept sets, groups, numeric rules, the front door, bounds, the tensor-name table.
//!
//! One test binary per suite (`cargo test --test conformance`), so CI builds and links a few
//! binaries instead of one per file; each file below is a module.

#[path = "../common/mod.rs"]
mod common;

mod bounds;
mod bounds_inverse;
mod corrections;
mod cppo;
mod distributed;
mod entry_points;
mod front_door;
mod groups_lengths;
mod kept_mass;
mod kept_sets;
mod kpop;
mod lean_pass;
mod m2po;
mod numeric_rules;
mod opsm;
mod routing;
mod tensor_names;
mod topk;
mod verl_fuzz;
mod verl_golden;
