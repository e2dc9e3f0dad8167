//! `trmask report --tokenizer tokenizer.json`: token ids to text with Hugging Face's
//! `tokenizers` (a tokenizer.json as `transformers` saves it).

use std::path::Path;

/// The largest tokenizer.json read (a 250k-token vocabulary with merges is ~20 MB).
const LIMIT: u64 = 256 << 20;

/// Loads a tokenizer.json; a missing, oversized or unreadable file is an error naming it.
pub fn load(path: &Path) -> Result<tokenizers::Tokenizer, trmask::Error> {
    let name = path.display().to_string();
    let text = trmask::io::read_text(path, LIMIT)?;
    text.parse::<tokenizers::Tokenizer>().map_err(|e| {
        trmask::Error::file(&name, format!("is not a Hugging Face tokenizer.json ({e})"))
    })
}

/// The text of one token id as the tokenizer decodes it alone (special tokens included);
/// `None` for an id outside the vocabulary.
pub fn text(t: &tokenizers::Tokenizer, id: i64) -> Option<String> {
    let id = u32::try_from(id).ok()?;
    t.id_to_token(id)?;
    t.decode(&[id], false).ok()
}
