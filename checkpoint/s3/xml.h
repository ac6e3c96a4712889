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

// The name of the root element when `doc` is one complete, well-formed element: every start
// tag closed by its own end tag, in order, and nothing after the root but white space,
// comments and processing instructions (before it: those and an XML declaration). nullopt
// otherwise: an answer cut short (a listing ending after some </Contents>, still a 200 with a
// matching Content-Length) must not be read as a shorter document. Entities and names are not
// checked further; a DOCTYPE is refused (S3 never sends one).
std::optional<std::string> xml_root_name(const std::string& doc);

// <Error><Code>..</Code><Message>..</Message><RequestId>..</RequestId></Error>
struct S3ErrorBody {
  std::string code;
  std::string message;
  std::string request_id;
};
// nullopt when `body` is not an S3 error document.
std::optional<S3ErrorBody> parse_s3_error(const std::string& body);

}  // namespace mx::s3
