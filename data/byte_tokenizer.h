// The byte-level tokenizer: token ids are the UTF-8 bytes of the text (0..255). It needs no
// vocabulary file, so `mxtrain train` on a .txt corpus and `mxtrain generate` work out of the box.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mx {

std::vector<int32_t> byte_encode(const std::string& text);

// Ids outside 0..255 (a model with a larger vocabulary can sample them) are skipped. A model can
// also emit byte sequences that are not UTF-8; each maximal ill-formed subsequence becomes U+FFFD
// (the Unicode / WHATWG replacement practice), so the result is always valid UTF-8.
std::string byte_decode(const std::vector<int32_t>& ids);

// "" when every id of `ids` (the first `prompt_len` of them the prompt) has text, else a
// sentence saying how many generated (and prompt) ids >= 256 byte_decode leaves out, for a
// warning: a model with a larger vocabulary than the tokenizer's 256 samples them.
std::string ids_without_text(const std::vector<int32_t>& ids, size_t prompt_len);

// Valid UTF-8 from arbitrary bytes, by the same replacement rule.
std::string sanitize_utf8(const std::string& bytes);

}  // namespace mx
