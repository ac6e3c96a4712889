// Just enough XML for S3 responses: the text of elements by name, entity-decoded. S3's
// response documents are flat and regular (no CDATA, no mixed content), so a tag scanner is
// enough and keeps a full XML parser out of the dependency list.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace mx::s3 {

// &amp; &lt; &gt; &quot; &apos; &#NN; &#xNN; decoded (UTF-8 for numeric references).
std::string xml_unescape(const std::string& s);
std::string xml_escape(const std::string& s);

// The raw inner text of the first <tag>...</tag> (attributes allowed; <tag/> gives "").
std::optional<std::string> xml_first_raw(const std::string& doc, const std::string& tag);
// The same, entity-decoded.
std::optional<std::string> xml_first(const std::string& doc, const std::string& tag);
// The raw inner text of every <tag>...</tag>, in order.
std::vector<std::string> xml_all_raw(const std::string& doc, const std::string& tag);

// <Error><Code>..</Code><Message>..</Message><RequestId>..</RequestId></Error>
struct S3ErrorBody {
  std::string code;
  std::string message;
  std::string request_id;
};
// nullopt when `body` is not an S3 error document.
std::optional<S3ErrorBody> parse_s3_error(const std::string& body);

}  // namespace mx::s3
