#include "checkpoint/s3/xml.h"

#include <cstdlib>

namespace mx::s3 {

static void append_utf8(std::string& out, unsigned long cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string xml_unescape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    std::string ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") out += '&';
    else if (ent == "lt") out += '<';
    else if (ent == "gt") out += '>';
    else if (ent == "quot") out += '"';
    else if (ent == "apos") out += '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      bool hex = ent[1] == 'x' || ent[1] == 'X';
      append_utf8(out, std::strtoul(ent.c_str() + (hex ? 2 : 1), nullptr, hex ? 16 : 10));
    } else {
      out += s.substr(i, semi - i + 1);  // unknown entity: kept as is
    }
    i = semi;
  }
  return out;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

// Finds the next <tag ...> or <tag> or <tag/> at or after `from`. Returns the position just
// after the start tag's '>' in `inner_begin`, and the inner end (position of "</tag>").
static bool find_element(const std::string& doc, const std::string& tag, size_t from,
                         size_t& inner_begin, size_t& inner_end, size_t& after) {
  const std::string open = "<" + tag;
  const std::string close = "</" + tag + ">";
  size_t pos = from;
  while ((pos = doc.find(open, pos)) != std::string::npos) {
    size_t name_end = pos + open.size();
    if (name_end >= doc.size()) return false;
    char c = doc[name_end];
    if (c != '>' && c != ' ' && c != '/' && c != '\t' && c != '\n' && c != '\r') {
      pos = name_end;  // a longer tag name with this prefix
      continue;
    }
    size_t gt = doc.find('>', name_end);
    if (gt == std::string::npos) return false;
    if (doc[gt - 1] == '/') {  // <tag/>
      inner_begin = inner_end = gt + 1;
      after = gt + 1;
      return true;
    }
    size_t end = doc.find(close, gt + 1);
    if (end == std::string::npos) return false;
    inner_begin = gt + 1;
    inner_end = end;
    after = end + close.size();
    return true;
  }
  return false;
}

std::optional<std::string> xml_first_raw(const std::string& doc, const std::string& tag) {
  size_t b, e, a;
  if (!find_element(doc, tag, 0, b, e, a)) return std::nullopt;
  return doc.substr(b, e - b);
}

std::optional<std::string> xml_first(const std::string& doc, const std::string& tag) {
  auto raw = xml_first_raw(doc, tag);
  if (!raw) return std::nullopt;
  return xml_unescape(*raw);
}

std::vector<std::string> xml_all_raw(const std::string& doc, const std::string& tag) {
  std::vector<std::string> out;
  size_t from = 0, b, e, a;
  while (find_element(doc, tag, from, b, e, a)) {
    out.push_back(doc.substr(b, e - b));
    from = a;
  }
  return out;
}

std::optional<std::string> xml_root_name(const std::string& doc) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  std::vector<std::string> open;  // the element names not closed yet, innermost last
  std::string root;
  size_t i = 0;
  if (doc.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;  // a UTF-8 byte order mark
  while (i < doc.size()) {
    if (doc[i] != '<') {
      // Text: inside the root anything but '<'; outside it only white space.
      const size_t lt = doc.find('<', i);
      const size_t end = lt == std::string::npos ? doc.size() : lt;
      if (open.empty())
        for (size_t k = i; k < end; ++k)
          if (!space(doc[k])) return std::nullopt;
      i = end;
      continue;
    }
    if (doc.compare(i, 4, "<!--") == 0) {
      const size_t e = doc.find("-->", i + 4);
      if (e == std::string::npos) return std::nullopt;
      i = e + 3;
    } else if (doc.compare(i, 2, "<?") == 0) {
      const size_t e = doc.find("?>", i + 2);
      if (e == std::string::npos) return std::nullopt;
      i = e + 2;
    } else if (doc.compare(i, 9, "<![CDATA[") == 0) {
      if (open.empty()) return std::nullopt;
      const size_t e = doc.find("]]>", i + 9);
      if (e == std::string::npos) return std::nullopt;
      i = e + 3;
    } else if (doc.compare(i, 2, "<!") == 0) {
      return std::nullopt;  // a DOCTYPE or other declaration
    } else if (doc.compare(i, 2, "</") == 0) {
      const size_t gt = doc.find('>', i + 2);
      if (gt == std::string::npos || open.empty()) return std::nullopt;
      size_t name_end = gt;
      while (name_end > i + 2 && space(doc[name_end - 1])) --name_end;
      if (doc.compare(i + 2, name_end - (i + 2), open.back()) != 0 ||
          name_end - (i + 2) != open.back().size())
        return std::nullopt;  // closes another element than the innermost open one
      open.pop_back();
      i = gt + 1;
    } else {
      // A start tag: its name, then attributes (quoted values may hold '>' and '/').
      size_t k = i + 1;
      while (k < doc.size() && !space(doc[k]) && doc[k] != '>' && doc[k] != '/' && doc[k] != '<')
        ++k;
      if (k == i + 1 || k >= doc.size() || doc[k] == '<') return std::nullopt;
      const std::string name = doc.substr(i + 1, k - i - 1);
      char quote = 0;
      for (; k < doc.size(); ++k) {
        const char c = doc[k];
        if (quote) {
          if (c == quote) quote = 0;
        } else if (c == '"' || c == '\'') {
          quote = c;
        } else if (c == '<') {
          return std::nullopt;
        } else if (c == '>') {
          break;
        }
      }
      if (k >= doc.size()) return std::nullopt;  // the tag itself is cut short
      const bool empty_element = doc[k - 1] == '/';
      if (open.empty()) {
        if (!root.empty()) return std::nullopt;  // a second root element
        root = name;
      }
      if (!empty_element) open.push_back(name);
      i = k + 1;
    }
  }
  if (root.empty() || !open.empty()) return std::nullopt;
  return root;
}

std::optional<S3ErrorBody> parse_s3_error(const std::string& body) {
  auto err = xml_first_raw(body, "Error");
  if (!err) return std::nullopt;
  S3ErrorBody out;
  out.code = xml_first(*err, "Code").value_or("");
  out.message = xml_first(*err, "Message").value_or("");
  out.request_id = xml_first(*err, "RequestId").value_or("");
  if (out.code.empty() && out.message.empty()) return std::nullopt;
  return out;
}

}  // namespace mx::s3
