use naga::back::PipelineConstants;
use trmask::gpu::vocab_divergence::{vocab_constants, vocab_shader_source};
use trmask::DType;

#[test]
fn vocab_variants_validate_and_translate() {
    let src = vocab_shader_source();
    let module =
        naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
    for a in [DType::F32, DType::F16, DType::BF16] {
        for b in [DType::F32, DType::F16, DType::BF16] {
            for wg in [64u32, 256] {
                let mut pc = PipelineConstants::default();
                for (k, v) in vocab_constants(a, b, wg) {
                    pc.insert(k.to_string(), v);
                }
                let (m, i) = naga::back::pipeline_constants::process_overrides(
                    &module,
                    &info,
                    Some((naga::ShaderStage::Compute, "main")),
                    &pc,
                )
                .unwrap();
                let spv = naga::back::spv::write_vec(&m, &i, &Default::default(), None).unwrap();
                assert!(!spv.is_empty());
                let mut s = String::new();
                let mut w = naga::back::msl::Writer::new(&mut s);
                w.write(&m, &i, &Default::default(), &Default::default())
                    .unwrap();
                let mut s2 = String::new();
                let (ho, hp) = (Default::default(), Default::default());
                let mut w2 = naga::back::hlsl::Writer::new(&mut s2, &ho, &hp);
                w2.write(&m, &i, None).unwrap();
            }
        }
    }
}
