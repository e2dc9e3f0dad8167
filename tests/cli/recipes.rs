//! docs/RECIPES.md runs: every Python snippet is executed against fake framework objects
//! (tests/recipes/fakes.py: the same keys, shapes and tensor methods), and `trmask analyze`
//! reads what it wrote under the framework's names. Needs python3 with numpy and safetensors:
//! skipped with a message when they are absent, a failure under CI (`CI` set).

use crate::common;

use std::process::Command;

fn python_ok() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy, safetensors.numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `(section heading, code)` of every ```python block, in order.
fn blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut code: Option<String> = None;
    for line in md.lines() {
        match &mut code {
            Some(c) if line.trim_start().starts_with("```") => {
                out.push((heading.clone(), std::mem::take(c)));
                code = None;
            }
            Some(c) => {
                c.push_str(line);
                c.push('\n');
            }
            None if line.starts_with("```python") => code = Some(String::new()),
            None if line.starts_with("## ") => heading = line[3..].to_string(),
            None => {}
        }
    }
    out
}

#[test]
fn every_recipe_writes_a_batch_trmask_reads() {
    if !python_ok() {
        if std::env::var_os("CI").is_some() {
            panic!("python3 with numpy and safetensors is required under CI");
        }
        eprintln!("skipping: python3 with numpy + safetensors not available");
        return;
    }
    let md = std::fs::read_to_string("docs/RECIPES.md").unwrap();
    let cases = [
        ("verl", "verl", Some("verl")),
        ("TRL", "trl", Some("TRL")),
        ("prime-rl", "prime_rl", Some("prime-rl")),
        ("SkyRL", "skyrl", Some("SkyRL")),
        ("slime", "slime", Some("slime")),
        ("vLLM", "vllm", None),
    ];
    // the dump recipes: the helper block, then one section per framework (the Python package's
    // own recipes and the MoE routing recipes run in python/tests/test_docs.py)
    let all: Vec<(String, String)> = blocks(&md)
        .into_iter()
        .filter(|(h, _)| h.is_empty() || cases.iter().any(|c| h.starts_with(c.0)))
        .collect();
    let (helper, recipes) = all.split_first().expect("the helper block comes first");
    assert_eq!(recipes.len(), cases.len(), "one snippet per framework");
    for ((heading, code), (title, setup, names)) in recipes.iter().zip(cases) {
        assert!(heading.starts_with(title), "{heading} vs {title}");
        let dir = common::scratch("recipes", setup);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("helper.py"), &helper.1).unwrap();
        std::fs::write(dir.join("recipe.py"), code).unwrap();
        let driver = format!(
            "import sys\nsys.path.insert(0, 'tests/recipes')\nimport fakes\n\
             d = {dir:?}\ng = fakes.setup_{setup}(d)\n\
             exec(open(d + '/helper.py').read(), g)\nexec(open(d + '/recipe.py').read(), g)\n\
             f = getattr(fakes, 'finish_{setup}', None)\nif f: f(d)\n",
            dir = dir.to_str().unwrap()
        );
        let out = Command::new("python3")
            .args(["-c", &driver])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{title} recipe failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file = dir.join("step3.safetensors");
        let (code, stdout, err) = common::run_trmask(&[
            "analyze",
            file.to_str().unwrap(),
            "--backend",
            "cpu",
            "--preset",
            "decoupled_k3_rs",
        ]);
        assert_eq!(code, 0, "{title}: {err}");
        assert!(stdout.contains("accepted:"), "{title}: {stdout}");
        if let Some(n) = names {
            assert!(
                err.contains(&format!("input: {n} names (")),
                "{title}: {err}"
            );
        }
    }
}
