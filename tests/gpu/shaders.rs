//! Every kernel variant the pipeline cache can build is parsed, validated by naga with the
//! minimum capabilities it needs, and translated to SPIR-V, MSL and HLSL. No GPU needed.

use naga::back::{hlsl, msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use trmask::gpu::pipeline::{
    all_kernel_keys, shader_source, Flavour, KernelKey, ENTRY_POINT, MATH, ROWS_OVERRIDE,
    WORKGROUP_OVERRIDE,
};

fn parse(key: &KernelKey) -> naga::Module {
    let src = shader_source(key);
    naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("{}: {}", key.label(), e.emit_to_string(&src)))
}

/// Capabilities a variant needs: none beyond core WGSL for the workgroup flavour, SUBGROUP for
/// the subgroup flavour.
fn capabilities(key: &KernelKey) -> Capabilities {
    match key.flavour {
        Flavour::Workgroup => Capabilities::empty(),
        Flavour::Subgroup => Capabilities::SUBGROUP,
    }
}

/// The subgroup flavour exists, and needs (only) the SUBGROUP capability.
#[test]
fn subgroup_variants_need_the_subgroup_capability() {
    let keys = all_kernel_keys();
    let sg: Vec<_> = keys
        .iter()
        .filter(|k| k.flavour == Flavour::Subgroup)
        .collect();
    assert!(!sg.is_empty(), "no subgroup variants");
    for key in sg {
        let r = Validator::new(ValidationFlags::all(), Capabilities::empty()).validate(&parse(key));
        assert!(r.is_err(), "{} validated without SUBGROUP", key.label());
    }
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
        if key.rows > 1 {
            constants.insert(ROWS_OVERRIDE.to_string(), f64::from(key.rows));
        }
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
        assert_eq!(
            ep.workgroup_size,
            [key.workgroup * key.rows, 1, 1],
            "{label}"
        );

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

        let sg = key.flavour == Flavour::Subgroup;
        let msl_options = msl::Options {
            lang_version: if sg { (2, 1) } else { (1, 0) },
            ..Default::default()
        };
        msl::write_string(
            &module,
            &info,
            &msl_options,
            &msl::PipelineOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{label}: MSL: {e}"));

        let mut hlsl_out = String::new();
        let hlsl_options = hlsl::Options {
            shader_model: if sg {
                hlsl::ShaderModel::V6_0
            } else {
                hlsl::ShaderModel::V5_1
            },
            ..Default::default()
        };
        let pipeline_options = hlsl::PipelineOptions::default();
        hlsl::Writer::new(&mut hlsl_out, &hlsl_options, &pipeline_options)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{label}: HLSL: {e}"));
    }
}

/// Every variant binds its op's own uniform struct at binding 0, of the op's declared size,
/// and takes the one math library (no kernel keeps a private copy of a shared formula).
#[test]
fn every_variant_has_its_typed_uniform_and_the_math_library() {
    for key in all_kernel_keys() {
        let spec = key.op.spec();
        let module = parse(&key);
        let params = module
            .global_variables
            .iter()
            .find(|(_, g)| g.name.as_deref() == Some("params"))
            .map(|(_, g)| g)
            .unwrap_or_else(|| panic!("{}: no `params`", key.label()));
        assert_eq!(params.space, naga::AddressSpace::Uniform, "{}", key.label());
        let ty = &module.types[params.ty];
        assert_eq!(
            ty.name.as_deref(),
            Some(spec.params_struct),
            "{}",
            key.label()
        );
        match &ty.inner {
            naga::TypeInner::Struct { span, .. } => {
                assert_eq!(u64::from(*span), spec.params_size, "{}", key.label())
            }
            other => panic!("{}: params is {other:?}", key.label()),
        }
        let src = shader_source(&key);
        assert_eq!(src.matches(MATH).count(), 1, "{}", key.label());
        for f in [
            "fn k3_of",
            "fn expm1_acc",
            "fn w_of",
            "fn log1p_acc",
            "const BIG",
        ] {
            assert_eq!(
                src.matches(f).count(),
                1,
                "{}: `{f}` defined twice",
                key.label()
            );
        }
        for private in ["tk_load", "tk_expm1", "tk_k3", "params.flags"] {
            assert!(!src.contains(private), "{}: `{private}`", key.label());
        }
    }
}
