// URI and endpoint parsing, configuration from the environment, the backoff schedule, S3 XML,
// and redaction: the pure pieces of the S3 client.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "checkpoint/s3/client.h"
#include "checkpoint/s3/crypto.h"
#include "checkpoint/s3/retry.h"
#include "checkpoint/s3/uri.h"
#include "checkpoint/s3/xml.h"
#include "core/error.h"

using namespace mx::s3;

TEST(S3Uri, ParsesBucketAndKey) {
  S3Uri u = parse_s3_uri("s3://my-bucket/ckpt/run1/step_00000100");
  EXPECT_EQ(u.bucket, "my-bucket");
  EXPECT_EQ(u.key, "ckpt/run1/step_00000100");
  EXPECT_EQ(u.str(), "s3://my-bucket/ckpt/run1/step_00000100");
  EXPECT_EQ(parse_s3_uri("s3://abc").key, "");
  EXPECT_EQ(parse_s3_uri("s3://abc/").key, "");
  EXPECT_EQ(parse_s3_uri("s3://a.b-c/x//y").key, "x//y");
  EXPECT_TRUE(is_s3_uri("s3://x"));
  EXPECT_FALSE(is_s3_uri("/local/dir"));
}

static std::string user_error_of(const std::string& uri) {
  try {
    parse_s3_uri(uri);
  } catch (const mx::UserError& e) {
    return e.what();
  }
  return "";
}

TEST(S3Uri, RejectsDotSegmentsAndControlCharacters) {
  // libcurl removes "." and ".." segments from the path after it was signed; a newline would
  // split the one-line error messages that name the key.
  for (const char* bad : {"s3://abc/..", "s3://abc/a/../b", "s3://abc/a/./b", "s3://abc/."})
    EXPECT_NE(user_error_of(bad).find("segment"), std::string::npos) << bad;
  for (const char* bad : {"s3://abc/a\nb", "s3://abc/a\tb", "s3://abc/a\x7f"})
    EXPECT_NE(user_error_of(bad).find("control character"), std::string::npos) << bad;
  EXPECT_EQ(user_error_of("s3://abc/a/..b/.c/d..").find("segment"), std::string::npos);
  EXPECT_EQ(parse_s3_uri("s3://abc/a/..b/.c/d..").key, "a/..b/.c/d..");
}

TEST(S3Uri, RejectsBadInputWithClearUserErrors) {
  EXPECT_NE(user_error_of("https://bucket/key").find("not an S3 URI"), std::string::npos);
  EXPECT_NE(user_error_of("s3:/bucket/key").find("not an S3 URI"), std::string::npos);
  EXPECT_NE(user_error_of("s3:///key").find("no bucket"), std::string::npos);
  EXPECT_NE(user_error_of("s3://ab/key").find("3 to 63"), std::string::npos);
  EXPECT_NE(user_error_of("s3://" + std::string(64, 'a')).find("3 to 63"), std::string::npos);
  EXPECT_NE(user_error_of("s3://My_Bucket/k").find("lowercase"), std::string::npos);
  EXPECT_NE(user_error_of("s3://-bucket/k").find("start and end"), std::string::npos);
  EXPECT_NE(user_error_of("s3://a..b/k").find("'..'"), std::string::npos);
  EXPECT_NE(user_error_of("s3://192.168.5.4/k").find("IP address"), std::string::npos);
  EXPECT_NE(user_error_of("s3://bucket/" + std::string(1025, 'k')).find("1024"), std::string::npos);
}

TEST(S3Endpoint, Parses) {
  Endpoint e = parse_endpoint("http://127.0.0.1:5000", "X");
  EXPECT_EQ(e.scheme, "http");
  EXPECT_EQ(e.host, "127.0.0.1");
  EXPECT_EQ(e.port, 5000);
  EXPECT_EQ(e.authority(), "127.0.0.1:5000");
  EXPECT_EQ(parse_endpoint("HTTPS://s3.us-west-2.amazonaws.com/", "X").authority(),
            "s3.us-west-2.amazonaws.com");
  EXPECT_EQ(parse_endpoint("https://h:443", "X").authority(), "h");  // default port dropped
  EXPECT_EQ(parse_endpoint("http://[::1]:9000", "X").authority(), "[::1]:9000");
  EXPECT_THROW(parse_endpoint("127.0.0.1:5000", "X"), mx::UserError);
  EXPECT_THROW(parse_endpoint("ftp://h", "X"), mx::UserError);
  EXPECT_THROW(parse_endpoint("http://h:99999", "X"), mx::UserError);
  EXPECT_THROW(parse_endpoint("http://h/path", "X"), mx::UserError);
  try {
    parse_endpoint("http://h:port", "AWS_ENDPOINT_URL_S3");
    FAIL();
  } catch (const mx::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("AWS_ENDPOINT_URL_S3"), std::string::npos);
  }
}

static EnvLookup env_of(std::map<std::string, std::string> m) {
  return [m](const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

TEST(S3Config, RegionAndEndpointFromEnvironment) {
  EXPECT_EQ(S3Config::from_env(env_of({})).region, "us-east-1");
  EXPECT_EQ(S3Config::from_env(env_of({{"AWS_DEFAULT_REGION", "eu-west-1"}})).region, "eu-west-1");
  EXPECT_EQ(S3Config::from_env(env_of({{"AWS_DEFAULT_REGION", "eu-west-1"}, {"AWS_REGION", "ap-south-1"}}))
                .region,
            "ap-south-1");
  EXPECT_EQ(S3Config::from_env(env_of({{"AWS_ENDPOINT_URL", "http://a:1"}})).endpoint_url, "http://a:1");
  EXPECT_EQ(S3Config::from_env(env_of({{"AWS_ENDPOINT_URL", "http://a:1"},
                                       {"AWS_ENDPOINT_URL_S3", "http://b:2"}}))
                .endpoint_url,
            "http://b:2");
  EXPECT_THROW(S3Config::from_env(env_of({{"MXTRAIN_S3_ADDRESSING", "sideways"}})), mx::UserError);
}

TEST(S3Config, AddressingStyleAndValidation) {
  auto creds = std::make_shared<StaticCredentials>(Credentials{"AKIDEXAMPLE", "secret", "", 0});
  S3Config aws;
  aws.region = "us-west-2";
  S3Client a(aws, creds);
  EXPECT_EQ(a.object_url("bkt", "a b/c.bin"), "https://bkt.s3.us-west-2.amazonaws.com/a%20b/c.bin");
  EXPECT_EQ(a.object_url("b.k.t", "x"), "https://s3.us-west-2.amazonaws.com/b.k.t/x");  // dotted
  S3Config moto;
  moto.endpoint_url = "http://127.0.0.1:5000";
  EXPECT_EQ(S3Client(moto, creds).object_url("bkt", "k"), "http://127.0.0.1:5000/bkt/k");
  moto.addressing = Addressing::kVirtualHost;
  EXPECT_EQ(S3Client(moto, creds).object_url("bkt", "k"), "http://bkt.127.0.0.1:5000/k");
  S3Config small = aws;
  small.part_size = (5 << 20) - 1;
  EXPECT_THROW(S3Client(small, creds), mx::UserError);
  S3Config bad_region = aws;
  bad_region.region = "us east";
  EXPECT_THROW(S3Client(bad_region, creds), mx::UserError);
}

TEST(S3Retry, BackoffCapsDoubleUpToTheMaximum) {
  RetryPolicy p{8, 0.1, 2.0};
  EXPECT_DOUBLE_EQ(backoff_cap_s(p, 1), 0.1);
  EXPECT_DOUBLE_EQ(backoff_cap_s(p, 2), 0.2);
  EXPECT_DOUBLE_EQ(backoff_cap_s(p, 4), 0.8);
  EXPECT_DOUBLE_EQ(backoff_cap_s(p, 5), 1.6);
  EXPECT_DOUBLE_EQ(backoff_cap_s(p, 6), 2.0);
  EXPECT_DOUBLE_EQ(backoff_cap_s(p, 1000), 2.0);  // no overflow
}

TEST(S3Retry, FullJitterSpansZeroToTheCap) {
  RetryPolicy p{8, 0.1, 2.0};
  std::mt19937_64 rng(42);
  for (int retry = 1; retry <= 8; ++retry) {
    double cap = backoff_cap_s(p, retry), lo = 1e9, hi = -1, sum = 0;
    const int n = 4000;
    for (int i = 0; i < n; ++i) {
      double d = backoff_delay_s(p, retry, rng);
      ASSERT_GE(d, 0.0);
      ASSERT_LE(d, cap);
      lo = std::min(lo, d);
      hi = std::max(hi, d);
      sum += d;
    }
    // Uniform on [0, cap]: the extremes come close to both ends, the mean to cap/2.
    EXPECT_LT(lo, 0.01 * cap) << retry;
    EXPECT_GT(hi, 0.99 * cap) << retry;
    EXPECT_NEAR(sum / n, cap / 2, 0.03 * cap) << retry;
  }
}

TEST(S3Retry, WhatIsRetried) {
  EXPECT_TRUE(is_retryable_status(500));
  EXPECT_TRUE(is_retryable_status(503));
  EXPECT_TRUE(is_retryable_status(429));
  EXPECT_FALSE(is_retryable_status(400));
  EXPECT_FALSE(is_retryable_status(403));
  EXPECT_FALSE(is_retryable_status(404));
  EXPECT_TRUE(is_retryable_s3_code("RequestTimeout"));
  EXPECT_FALSE(is_retryable_s3_code("NoSuchKey"));
  EXPECT_TRUE(is_retryable_transport_error(7));    // CURLE_COULDNT_CONNECT
  EXPECT_TRUE(is_retryable_transport_error(28));   // CURLE_OPERATION_TIMEDOUT
  EXPECT_TRUE(is_retryable_transport_error(56));   // CURLE_RECV_ERROR (reset)
  EXPECT_TRUE(is_retryable_transport_error(52));   // CURLE_GOT_NOTHING
  EXPECT_FALSE(is_retryable_transport_error(3));   // CURLE_URL_MALFORMAT
  EXPECT_FALSE(is_retryable_transport_error(23));  // CURLE_WRITE_ERROR
}

TEST(S3Xml, ParsesErrorDocuments) {
  // The NoSuchKey example from the S3 API reference ("Error responses").
  const std::string body =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>\n  <Code>NoSuchKey</Code>\n"
      "  <Message>The resource you requested does not exist</Message>\n"
      "  <Resource>/mybucket/myfoto.jpg</Resource>\n  <RequestId>4442587FB7D0A2F9</RequestId>\n"
      "</Error>";
  auto e = parse_s3_error(body);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "NoSuchKey");
  EXPECT_EQ(e->message, "The resource you requested does not exist");
  EXPECT_EQ(e->request_id, "4442587FB7D0A2F9");
  auto e2 = parse_s3_error("<Error><Code>SignatureDoesNotMatch</Code><Message>a &amp; b &lt;c&gt; "
                           "&quot;d&quot; &#233;</Message></Error>");
  ASSERT_TRUE(e2.has_value());
  EXPECT_EQ(e2->message, "a & b <c> \"d\" \xc3\xa9");
  EXPECT_FALSE(parse_s3_error("").has_value());
  EXPECT_FALSE(parse_s3_error("<html>502 Bad Gateway</html>").has_value());
  EXPECT_FALSE(parse_s3_error("<ListBucketResult></ListBucketResult>").has_value());
}

TEST(S3Xml, ElementsByName) {
  const std::string doc =
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
      "<Contents><Key>a&amp;b</Key><Size>3</Size><ETag>&quot;abc&quot;</ETag></Contents>"
      "<Contents><Key>c</Key><Size>44</Size></Contents><KeyCount>2</KeyCount><Prefix/>"
      "<IsTruncated>true</IsTruncated><NextContinuationToken>tok/+=</NextContinuationToken>"
      "</ListBucketResult>";
  auto all = xml_all_raw(doc, "Contents");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(xml_first(all[0], "Key"), "a&b");
  EXPECT_EQ(xml_first(all[0], "ETag"), "\"abc\"");
  EXPECT_EQ(xml_first(all[1], "Size"), "44");
  EXPECT_EQ(xml_first(doc, "Prefix"), "");
  EXPECT_EQ(xml_first(doc, "Name"), "b");  // not confused with NextContinuationToken etc.
  EXPECT_EQ(xml_first(doc, "NextContinuationToken"), "tok/+=");
  EXPECT_FALSE(xml_first(doc, "Missing").has_value());
  EXPECT_EQ(xml_escape("<a&'\">"), "&lt;a&amp;&apos;&quot;&gt;");
}

// An answer cut short must not read as a shorter document: a listing ending after some
// </Contents> (a 200 with a matching Content-Length) was read as a short listing, and a run's
// start-up deleted the files of the committed step it no longer saw.
TEST(S3Xml, OnlyACompleteDocumentHasARoot) {
  const std::string full =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws"
      ".com/doc/2006-03-01/\"><Name>b</Name><Prefix/><Contents><Key>a&amp;b</Key><Size>3</Size>"
      "</Contents><Contents><Key>c</Key><Size>4</Size></Contents><IsTruncated>false</IsTruncated>"
      "</ListBucketResult>\n";
  EXPECT_EQ(xml_root_name(full), "ListBucketResult");
  EXPECT_EQ(xml_root_name("  <!-- c --><A x='1>2' y=\"/\"><B/><C >t &lt; u</C ><![CDATA[<x>]]></A>"
                          "<?pi?> \r\n"), "A");
  for (size_t cut : {full.find("</Contents>") + 11, full.find("<IsTruncated>"),
                     full.size() - 3, full.find("<Key>c") + 3}) {
    EXPECT_FALSE(xml_root_name(full.substr(0, cut)).has_value()) << full.substr(0, cut);
  }
  EXPECT_FALSE(xml_root_name("").has_value());
  EXPECT_FALSE(xml_root_name("   ").has_value());
  EXPECT_FALSE(xml_root_name("<html>portal").has_value());
  EXPECT_FALSE(xml_root_name("<A></B>").has_value());           // closes another element
  EXPECT_FALSE(xml_root_name("<A><B></A></B>").has_value());    // out of order
  EXPECT_FALSE(xml_root_name("<A></A><A></A>").has_value());    // two roots
  EXPECT_FALSE(xml_root_name("<A></A>trailing").has_value());   // text after the root
  EXPECT_FALSE(xml_root_name("<A x=\"1></A>").has_value());     // a quote never closed
  EXPECT_FALSE(xml_root_name("<!DOCTYPE A><A></A>").has_value());
  EXPECT_FALSE(xml_root_name("<A><!-- </A>").has_value());      // an unclosed comment
  EXPECT_EQ(xml_root_name("<Error><Code>X</Code></Error>"), "Error");
}

TEST(S3Integrity, MultipartEtagAndRedaction) {
  // Two parts "a" * 5 MiB and "b": ETag = md5(md5(p1) || md5(p2)) + "-2".
  std::string p1(5 << 20, 'a'), p2 = "b";
  std::string both = md5(p1.data(), p1.size()) + md5(p2.data(), p2.size());
  EXPECT_EQ(multipart_etag({md5(p1.data(), p1.size()), md5(p2.data(), p2.size())}),
            to_hex(md5(both.data(), both.size())) + "-2");
  Credentials c{"AKIAEXAMPLEKEYID", "very/secret+key", "tok3n-value", 0};
  EXPECT_EQ(redact("id AKIAEXAMPLEKEYID s very/secret+key t tok3n-value.", c), "id *** s *** t ***.");
}
