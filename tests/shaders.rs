//! Every kernel variant the pipeline cache can build is parsed, validated by naga with the
//! minimum capabilities it needs, and translated to SPIR-V, MSL and HLSL. No GPU needed.

use naga::back::{hlsl, msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use trmask::gpu::pipeline::{
    all_kernel_keys, shader_source, KernelKey, ENTRY_POINT, META_SIZE, WORKGROUP_OVERRIDE,
};

fn parse(key: &KernelKey) -> naga::Module {
    let src = shader_source(key);
    naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{}: {}", key.label(), e.emit_to_string(&src)))
}

/// Capabilities a variant needs: none beyond core WGSL for the workgroup flavour.
fn capabilities(_key: &KernelKey) -> Capabilities {
    Capabilities::empty()
}

#[test]
fn every_variant_validates_and_translates() {
    let keys = all_kernel_keys();
    assert!(!keys.is_empty());
    for key in &keys {
        let label = key.label();
        let module = parse(key);
        let info = Validator::new(ValidationFlags::all(), capabilities(key))
            .validate(&module)
            .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(&shader_source(key))));
        let mut constants = naga::back::PipelineConstants::default();
        constants.insert(WORKGROUP_OVERRIDE.to_string(), f64::from(key.workgroup));
        let (module, info) = naga::back::pipeline_constants::process_overrides(
            &module,
            &info,
            Some((naga::ShaderStage::Compute, ENTRY_POINT)),
            &constants,
        )
        .unwrap_or_else(|e| panic!("{label}: overrides: {e}"));
        let ep = module
            .entry_points
            .iter()
            .find(|e| e.name == ENTRY_POINT)
            .unwrap_or_else(|| panic!("{label}: no entry point"));
        assert_eq!(ep.workgroup_size, [key.workgroup, 1, 1], "{label}");

        spv::write_vec(
            &module,
            &info,
            &spv::Options::default(),
            Some(&spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: ENTRY_POINT.to_string(),
            }),
        )
        .unwrap_or_else(|e| panic!("{label}: SPIR-V: {e}"));

        msl::write_string(
            &module,
            &info,
            &msl::Options::default(),
            &msl::PipelineOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{label}: MSL: {e}"));

        let mut hlsl_out = String::new();
        let hlsl_options = hlsl::Options::default();
        let pipeline_options = hlsl::PipelineOptions::default();
        hlsl::Writer::new(&mut hlsl_out, &hlsl_options, &pipeline_options)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{label}: HLSL: {e}"));
    }
}

#[test]
fn meta_struct_matches_its_rust_twin() {
    let key = all_kernel_keys()[0];
    let module = parse(&key);
    let (_, ty) = module
        .types
        .iter()
        .find(|(_, t)| t.name.as_deref() == Some("Meta"))
        .expect("Meta struct in the prelude");
    match &ty.inner {
        naga::TypeInner::Struct { span, members } => {
            assert_eq!(u64::from(*span), META_SIZE);
            assert_eq!(members.len(), 8);
        }
        other => panic!("Meta is {other:?}"),
    }
}
