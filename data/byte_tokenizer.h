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

// Valid UTF-8 from arbitrary bytes, by the same replacement rule.
std::string sanitize_utf8(const std::string& bytes);

}  // namespace mx
