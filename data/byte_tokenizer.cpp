#include "data/byte_tokenizer.h"

#include <cstddef>

namespace mx {

namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// Length of the sequence a lead byte starts, 0 if it cannot start one (continuation bytes,
// C0/C1 overlong leads, F5..FF beyond U+10FFFF).
int sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// The second byte's range is narrower after some leads: that is what rules out overlong forms
// (E0, F0), UTF-16 surrogates (ED) and code points above U+10FFFF (F4).
bool valid_second_byte(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;
    case 0xED: return b >= 0x80 && b <= 0x9F;
    case 0xF0: return b >= 0x90 && b <= 0xBF;
    case 0xF4: return b >= 0x80 && b <= 0x8F;
    default: return b >= 0x80 && b <= 0xBF;
  }
}

}  // namespace

std::vector<int32_t> byte_encode(const std::string& text) {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string sanitize_utf8(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    const int len = sequence_length(lead);
    if (len == 1) {
      out.push_back(bytes[i++]);
      continue;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    // Take continuation bytes while they fit; a sequence cut short is one maximal subpart,
    // replaced once, and the byte that broke it is looked at again as a new lead.
    size_t j = i + 1;
    while (j < i + static_cast<size_t>(len) && j < n) {
      const auto b = static_cast<unsigned char>(bytes[j]);
      const bool ok = j == i + 1 ? valid_second_byte(lead, b) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++j;
    }
    if (j == i + static_cast<size_t>(len)) {
      out.append(bytes, i, static_cast<size_t>(len));
    } else {
      out += kReplacement;
    }
    i = j;
  }
  return out;
}

std::string byte_decode(const std::vector<int32_t>& ids) {
  std::string bytes;
  bytes.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) bytes.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return sanitize_utf8(bytes);
}

std::string ids_without_text(const std::vector<int32_t>& ids, size_t prompt_len) {
  size_t in_prompt = 0, generated = 0;
  for (size_t i = 0; i < ids.size(); ++i) (i < prompt_len ? in_prompt : generated) += ids[i] >= 256;
  if (in_prompt + generated == 0) return "";
  std::string s = std::to_string(generated) + " of the " + std::to_string(ids.size() - prompt_len) +
                  " generated tokens";
  if (in_prompt)
    s += " and " + std::to_string(in_prompt) + " of the " + std::to_string(prompt_len) +
         " prompt tokens";
  return s + " have ids >= 256, which the byte-level tokenizer has no text for: left out of the "
             "text";
}

}  // namespace mx
