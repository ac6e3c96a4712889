// The S3 client and the credentials chain against a tiny HTTP server on 127.0.0.1 that this
// test runs: retries (5xx, 429, connection resets, timeouts), final 4xx errors, what requests
// carry, and every credentials source. Nothing here contacts 169.254.x.x.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "checkpoint/s3/client.h"
#include "checkpoint/s3/credentials.h"
#include "checkpoint/s3/crypto.h"
#include "core/error.h"

using namespace mx::s3;

namespace {

struct SeenRequest {
  std::string method, target;  // target: path?query
  std::map<std::string, std::string> headers;  // lowercased names
  std::string body;
};

struct Reply {
  int status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool reset = false;      // close the connection without answering
  int delay_ms = 0;        // wait before answering
};

// One thread, one connection at a time, "Connection: close" on every answer.
class LocalServer {
 public:
  explicit LocalServer(std::function<Reply(const SeenRequest&)> handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0)
      throw std::runtime_error("LocalServer: bind/listen failed");
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~LocalServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<SeenRequest> requests() {
    std::lock_guard<std::mutex> l(mu_);
    return seen_;
  }
  size_t count() {
    std::lock_guard<std::mutex> l(mu_);
    return seen_.size();
  }

 private:
  void loop() {
    while (!stop_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) {
        if (stop_) return;
        continue;
      }
      serve(c);
      ::close(c);
    }
  }
  void serve(int c) {
    std::string buf;
    char tmp[65536];
    size_t header_end;
    while ((header_end = buf.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
      if (n <= 0) return;
      buf.append(tmp, n);
    }
    SeenRequest r;
    std::string head = buf.substr(0, header_end);
    size_t line_end = head.find("\r\n");
    std::string first = head.substr(0, line_end);
    size_t sp1 = first.find(' '), sp2 = first.rfind(' ');
    r.method = first.substr(0, sp1);
    r.target = first.substr(sp1 + 1, sp2 - sp1 - 1);
    size_t pos = line_end + 2;
    while (pos < head.size()) {
      size_t e = head.find("\r\n", pos);
      if (e == std::string::npos) e = head.size();
      std::string line = head.substr(pos, e - pos);
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        std::string v = line.substr(colon + 1);
        v.erase(0, v.find_first_not_of(' '));
        r.headers[name] = v;
      }
      pos = e + 2;
    }
    size_t want = r.headers.count("content-length") ? std::stoul(r.headers["content-length"]) : 0;
    r.body = buf.substr(header_end + 4);
    while (r.body.size() < want) {
      ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
      if (n <= 0) break;
      r.body.append(tmp, n);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      seen_.push_back(r);
    }
    Reply reply = handler_(r);
    if (reply.delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(reply.delay_ms));
    if (reply.reset) {
      linger lg{1, 0};  // RST instead of FIN
      ::setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
      return;
    }
    std::string out = "HTTP/1.1 " + std::to_string(reply.status) + " X\r\n";
    for (auto& [k, v] : reply.headers) out += k + ": " + v + "\r\n";
    bool has_len = false;
    for (auto& [k, v] : reply.headers) has_len |= k == "Content-Length";
    if (!has_len && r.method != "HEAD") out += "Content-Length: " + std::to_string(reply.body.size()) + "\r\n";
    out += "Connection: close\r\n\r\n";
    if (r.method != "HEAD") out += reply.body;
    size_t sent = 0;
    while (sent < out.size()) {
      ssize_t n = ::send(c, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += n;
    }
  }

  std::function<Reply(const SeenRequest&)> handler_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<SeenRequest> seen_;
};

const Credentials kCreds{"AKIDLOCALTESTKEY", "local/Secret+Key/abcdef", "LocalSessionTokenXYZ", 0};

S3Client client_for(const LocalServer& s, int attempts = 4) {
  S3Config c;
  c.endpoint_url = s.url();
  c.retry = RetryPolicy{attempts, 0.001, 0.01};
  c.timeouts.total_ms = 2000;
  return S3Client(c, std::make_shared<StaticCredentials>(kCreds));
}

Reply s3_error(int status, const std::string& code, const std::string& message) {
  Reply r;
  r.status = status;
  r.body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>" + code + "</Code><Message>" +
           message + "</Message><RequestId>REQ123</RequestId></Error>";
  return r;
}

void expect_no_credentials(const std::string& text) {
  EXPECT_EQ(text.find(kCreds.secret_access_key), std::string::npos) << text;
  EXPECT_EQ(text.find(kCreds.session_token), std::string::npos) << text;
  EXPECT_EQ(text.find(kCreds.access_key_id), std::string::npos) << text;
}

EnvLookup env_of(std::map<std::string, std::string> m) {
  return [m](const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace

TEST(S3Retries, ServerErrorsAreRetriedUntilSuccess) {
  std::atomic<int> n{0};
  LocalServer s([&](const SeenRequest&) {
    int i = n++;
    if (i == 0) return s3_error(503, "SlowDown", "Please reduce your request rate.");
    if (i == 1) return s3_error(500, "InternalError", "We encountered an internal error.");
    if (i == 2) return Reply{429, "too many"};
    return Reply{200, "hello", {{"ETag", "\"5d41402abc4b2a76b9719d911017c592\""}}};  // MD5("hello")
  });
  testing::internal::CaptureStderr();
  std::string body = client_for(s, 5).get_object("bkt", "dir/key.bin");
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(body, "hello");
  EXPECT_EQ(s.count(), 4u);
  EXPECT_NE(log.find("SlowDown"), std::string::npos) << log;  // retries are reported ...
  expect_no_credentials(log);                                   // ... without credentials
  for (const auto& r : s.requests()) {
    EXPECT_EQ(r.target, "/bkt/dir/key.bin");
    EXPECT_EQ(r.headers.at("x-amz-security-token"), kCreds.session_token);
    EXPECT_EQ(r.headers.at("x-amz-content-sha256"), kEmptyPayloadSha256);
    EXPECT_EQ(r.headers.at("host"), s.url().substr(7));
  }
}

TEST(S3Retries, ConnectionResetsAndTimeoutsAreRetried) {
  std::atomic<int> n{0};
  LocalServer s([&](const SeenRequest&) {
    int i = n++;
    if (i == 0) return Reply{.reset = true};
    if (i == 1) return Reply{200, "late", {}, false, 2500};  // past total_ms = 1000
    return Reply{200, "ok", {{"ETag", "\"c7b2d2b2c3e1c1a0b9e1e6a3a1b2c3d4-1\""}}};  // multipart form
  });
  testing::internal::CaptureStderr();
  S3Config c;
  c.endpoint_url = s.url();
  // Generous absolute times so a loaded machine (ctest -j2 beside other work) cannot make a
  // healthy request look like a timeout.
  c.retry = RetryPolicy{7, 0.001, 0.01};
  c.timeouts.total_ms = 1000;
  EXPECT_EQ(S3Client(c, std::make_shared<StaticCredentials>(kCreds)).get_object("bkt", "k"), "ok");
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("connection error"), std::string::npos) << log;
  // Reset, timeout, then success; one or two more timeouts are possible while the one-thread
  // server is still sleeping on the timed-out connection.
  EXPECT_GE(s.count(), 3u);
  EXPECT_LE(s.count(), 5u);
}

TEST(S3Retries, GivesUpAfterMaxAttemptsWithAStorageError) {
  LocalServer s([&](const SeenRequest&) { return s3_error(500, "InternalError", "boom"); });
  testing::internal::CaptureStderr();
  try {
    client_for(s, 3).put_object("bkt", "k", "abc", 3);
    FAIL() << "no error";
  } catch (const mx::StorageError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("PutObject s3://bkt/k"), std::string::npos) << m;
    EXPECT_NE(m.find("InternalError: boom"), std::string::npos) << m;
    EXPECT_NE(m.find("after 3 attempts"), std::string::npos) << m;
    expect_no_credentials(m);
  }
  expect_no_credentials(testing::internal::GetCapturedStderr());
  EXPECT_EQ(s.count(), 3u);
}

TEST(S3Retries, ClientErrorsFailAtOnceNamingOperationBucketKeyAndCode) {
  LocalServer s([&](const SeenRequest& r) {
    if (r.target.find("missing") != std::string::npos)
      return s3_error(404, "NoSuchKey", "The specified key does not exist.");
    // Real S3 echoes the access key id in some error bodies: it must not reach the message.
    return s3_error(403, "AccessDenied", "Access Denied for " + kCreds.access_key_id);
  });
  S3Client c = client_for(s);
  try {
    c.get_object("bkt", "missing/obj");
    FAIL();
  } catch (const mx::StorageError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("GetObject s3://bkt/missing/obj"), std::string::npos) << m;
    EXPECT_NE(m.find("HTTP 404 NoSuchKey: The specified key does not exist."), std::string::npos) << m;
    EXPECT_NE(m.find("REQ123"), std::string::npos) << m;
  }
  EXPECT_EQ(s.count(), 1u);
  try {
    c.delete_object("bkt", "secret/obj");
    FAIL();
  } catch (const mx::UserError& e) {  // refused credentials: configuration, exit 2
    std::string m = e.what();
    EXPECT_NE(m.find("DeleteObject s3://bkt/secret/obj"), std::string::npos) << m;
    EXPECT_NE(m.find("AccessDenied"), std::string::npos) << m;
    expect_no_credentials(m);
  }
  EXPECT_EQ(s.count(), 2u);
  // HEAD has no body: a 404 is "no such object", a 403 an error named by its status.
  EXPECT_FALSE(c.head_object("bkt", "missing").has_value());
  EXPECT_THROW(c.head_object("bkt", "other"), mx::UserError);
}

TEST(S3Requests, PutCarriesContentMd5AndSignedPayloadHash) {
  std::string payload(1000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7);
  const std::string md5_hex = to_hex(md5(payload.data(), payload.size()));
  LocalServer s([&](const SeenRequest&) {
    return Reply{200, "", {{"ETag", "\"" + md5_hex + "\""}}};
  });
  EXPECT_EQ(client_for(s).put_object("bkt", "a b+c", payload.data(), payload.size()), md5_hex);
  auto r = s.requests().at(0);
  EXPECT_EQ(r.method, "PUT");
  EXPECT_EQ(r.target, "/bkt/a%20b%2Bc");
  EXPECT_EQ(r.body, payload);
  // md5/sha256 themselves are checked against FIPS/RFC vectors in test_s3_crypto_sigv4.cpp.
  EXPECT_EQ(r.headers.at("content-md5"), base64(md5(payload.data(), payload.size())));
  EXPECT_EQ(r.headers.at("x-amz-content-sha256"), sha256_hex(payload));
  const std::string auth = r.headers.at("authorization");
  EXPECT_EQ(auth.rfind("AWS4-HMAC-SHA256 Credential=AKIDLOCALTESTKEY/", 0), 0u) << auth;
  EXPECT_NE(auth.find("/us-east-1/s3/aws4_request,SignedHeaders=content-md5;host;"
                      "x-amz-content-sha256;x-amz-date;x-amz-security-token,Signature="),
            std::string::npos) << auth;
  EXPECT_EQ(auth.find(kCreds.secret_access_key), std::string::npos);
}

TEST(S3Requests, WrongEtagOnPutIsAStorageError) {
  LocalServer s([&](const SeenRequest&) {
    return Reply{200, "", {{"ETag", "\"00000000000000000000000000000000\""}}};
  });
  EXPECT_THROW(client_for(s).put_object("bkt", "k", "abc", 3), mx::StorageError);
}

// S3 answers a stored PUT and every GET of an object with its ETag: a 200 without one is a
// proxy's or portal's page (a manifest PUT "committed" nothing; an HTML page GET was read as
// a corrupt manifest and the good checkpoint skipped).
TEST(S3Requests, AnAnswerWithoutAnEtagIsAStorageError) {
  LocalServer s([&](const SeenRequest&) { return Reply{200, "<html>portal</html>"}; });
  EXPECT_THROW(client_for(s).put_object("bkt", "k", "abc", 3), mx::StorageError);
  EXPECT_THROW(client_for(s).get_object("bkt", "k"), mx::StorageError);
}

// SSE-KMS (a bucket's default encryption): ETags are not MD5s, for parts and for the completed
// object alike. The single PUT and the parts skipped the comparison; the completed object's
// ETag was still compared with md5(md5(part1)..)-N, failing every checkpoint file above the
// multipart threshold on such a bucket.
TEST(S3Requests, MultipartUploadOnAnSseKmsBucketIsNotComparedWithMd5s) {
  const std::vector<std::pair<std::string, std::string>> kms = {
      {"x-amz-server-side-encryption", "aws:kms"}};
  const std::string size = std::to_string(11u << 20);
  LocalServer s([&](const SeenRequest& r) {
    auto with = [&](Reply rep, const std::string& etag) {
      rep.headers = kms;
      if (!etag.empty()) rep.headers.emplace_back("ETag", "\"" + etag + "\"");
      return rep;
    };
    if (r.method == "POST" && r.target.find("uploads") != std::string::npos)
      return Reply{200, "<InitiateMultipartUploadResult><UploadId>U1</UploadId>"
                        "</InitiateMultipartUploadResult>"};
    if (r.method == "PUT") return with(Reply{200, ""}, "0123456789abcdef0123456789abcdef");
    if (r.method == "POST")
      return with(Reply{200, "<CompleteMultipartUploadResult><ETag>&quot;feedface-2&quot;</ETag>"
                             "</CompleteMultipartUploadResult>"}, "");
    if (r.method == "HEAD") {
      Reply h = with(Reply{200, ""}, "feedface-2");
      h.headers.emplace_back("Content-Length", size);
      return h;
    }
    return s3_error(400, "Unexpected", r.method);
  });
  S3Config c;
  c.endpoint_url = s.url();
  c.retry = RetryPolicy{2, 0.001, 0.01};
  c.timeouts.total_ms = 5000;
  c.part_size = c.multipart_threshold = 5u << 20;
  c.parallelism = 1;
  std::vector<uint8_t> data(11u << 20, 7);
  EXPECT_EQ(S3Client(c, std::make_shared<StaticCredentials>(kCreds))
                .upload("bkt", "k", data.data(), data.size()),
            "feedface-2");
}

// A truncated listing that hands back a continuation token it gave before would be listed
// forever (ckpt ls, verify and a run's start-up hung, unkillable but by SIGKILL).
TEST(S3Requests, AListingThatRepeatsItsContinuationTokenIsAStorageError) {
  std::atomic<int> n{0};
  LocalServer s([&](const SeenRequest&) {
    const int i = n++;
    const char* next = i % 2 ? "B" : "A";  // A, B, A, ...
    return Reply{200, mx::str("<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>",
                          "<Contents><Key>p/k", i, "</Key><Size>1</Size></Contents>",
                          "<NextContinuationToken>", next, "</NextContinuationToken></ListBucketResult>")};
  });
  try {
    client_for(s).list_all("bkt", "p/");
    FAIL() << "no error";
  } catch (const mx::StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("continuation token it had given before"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s.count(), 3u);
}

// Pages that keep handing out new tokens for keys already listed never end either (678
// requests in 30 s, memory growing, before).
TEST(S3Requests, AListingWhoseKeysDoNotAdvanceIsAStorageError) {
  std::atomic<int> n{0};
  LocalServer s([&](const SeenRequest&) {
    const int i = n++;
    return Reply{200, mx::str("<ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>p/a",
                              "</Key><Size>1</Size></Contents><NextContinuationToken>T", i,
                              "</NextContinuationToken></ListBucketResult>")};
  });
  try {
    client_for(s).list_all("bkt", "p");
    FAIL() << "no error";
  } catch (const mx::StorageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ListObjectsV2 s3://bkt/p failed"), std::string::npos) << m;
    EXPECT_NE(m.find("keys do not advance"), std::string::npos) << m;
  }
  EXPECT_EQ(s.count(), 2u);
}

// A listing cut after some </Contents> (a 200, a Content-Length to match) or lacking what every
// listing holds is not a shorter listing: a run's start-up deleted a committed step's files.
TEST(S3Requests, AnIncompleteListingIsAStorageError) {
  const std::string whole =
      "<?xml version=\"1.0\"?><ListBucketResult><Name>bkt</Name><Contents><Key>p/a</Key>"
      "<Size>1</Size></Contents><Contents><Key>p/b</Key><Size>2</Size></Contents>"
      "<IsTruncated>false</IsTruncated></ListBucketResult>";
  std::string body;
  LocalServer s([&](const SeenRequest&) { return Reply{200, body}; });
  S3Client c = client_for(s);
  body = whole;
  EXPECT_EQ(c.list_all("bkt", "p").size(), 2u);
  for (const std::string& bad :
       {whole.substr(0, whole.find("</Contents>") + 11), whole.substr(0, whole.size() - 1),
        std::string("<ListBucketResult><Contents><Size>1</Size></Contents><IsTruncated>false"
                    "</IsTruncated></ListBucketResult>"),
        std::string("<ListBucketResult><Contents><Key>k</Key></Contents><IsTruncated>false"
                    "</IsTruncated></ListBucketResult>"),
        std::string("<ListBucketResult><Contents><Key>k</Key><Size>1</Size></Contents>"
                    "</ListBucketResult>")}) {
    body = bad;
    try {
      c.list_all("bkt", "p");
      FAIL() << bad;
    } catch (const mx::StorageError& e) {
      EXPECT_NE(std::string(e.what()).find("ListObjectsV2 s3://bkt/p failed"), std::string::npos)
          << e.what();
    }
  }
}

// S3 answers every HEAD of an object with its size and ETag: without them the object read as
// 0 bytes with ETag "", and a good checkpoint as one that does not verify.
TEST(S3Requests, AHeadWithoutLengthOrEtagIsAStorageError) {
  std::vector<std::pair<std::string, std::string>> headers;
  LocalServer s([&](const SeenRequest&) { return Reply{200, "", headers}; });
  S3Client c = client_for(s);
  headers = {{"Content-Length", "5"}, {"ETag", "\"abc\""}};
  auto info = c.head_object("bkt", "k");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->size, 5u);
  EXPECT_EQ(info->etag, "abc");
  for (const auto& h : std::vector<std::vector<std::pair<std::string, std::string>>>{
           {{"ETag", "\"abc\""}}, {{"Content-Length", "5"}},
           {{"Content-Length", "-5"}, {"ETag", "\"abc\""}}}) {
    headers = h;
    EXPECT_THROW(c.head_object("bkt", "k"), mx::StorageError);
  }
}

// A whole-object read bounded by what it may be: a 300 MB answer for a manifest was buffered
// whole (988 MB peak). Pinned to the ETag the HEAD saw.
TEST(S3Requests, ABoundedGetStopsAtItsLimit) {
  const std::string big(4u << 20, 'x');
  LocalServer s([&](const SeenRequest& r) {
    EXPECT_EQ(r.headers.count("if-match") ? r.headers.at("if-match") : "", "\"e1\"");
    return Reply{200, big, {{"ETag", "\"e1-1\""}}};
  });
  try {
    client_for(s).get_object("bkt", "m.json", 1000, "e1");
    FAIL() << "no error";
  } catch (const mx::StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the 1000 bytes"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(client_for(s).get_object("bkt", "m.json", big.size(), "e1").size(), big.size());
}

TEST(S3Requests, ShortRangedReadIsAStorageError) {
  LocalServer s([&](const SeenRequest& r) {
    EXPECT_EQ(r.headers.at("range"), "bytes=10-19");
    return Reply{206, "short"};
  });
  EXPECT_THROW(client_for(s).get_range("bkt", "k", 10, 10), mx::StorageError);
}

// ------------------------------------------------------------------ credentials

TEST(S3Credentials, EnvironmentVariables) {
  auto c = credentials_from_env(env_of({{"AWS_ACCESS_KEY_ID", "AKID"},
                                        {"AWS_SECRET_ACCESS_KEY", "SECRET"},
                                        {"AWS_SESSION_TOKEN", "TOKEN"}}));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->access_key_id, "AKID");
  EXPECT_EQ(c->secret_access_key, "SECRET");
  EXPECT_EQ(c->session_token, "TOKEN");
  EXPECT_FALSE(credentials_from_env(env_of({})).has_value());
  try {
    credentials_from_env(env_of({{"AWS_ACCESS_KEY_ID", "AKID"}}));
    FAIL();
  } catch (const mx::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("AWS_SECRET_ACCESS_KEY"), std::string::npos);
  }
  EXPECT_EQ(parse_iso8601_utc("2013-05-24T00:00:00Z"), 1369353600);
  EXPECT_EQ(parse_iso8601_utc("2013-05-24T00:00:00.123Z"), 1369353600);
  EXPECT_EQ(parse_iso8601_utc("2013-05-24T02:00:00+02:00"), 1369353600);
  EXPECT_EQ(parse_iso8601_utc("2013-05-23T20:30:00-03:30"), 1369353600);
  // an offset past a day overflowed its int seconds (UBSan); the answer is unusable: exit 3
  EXPECT_THROW(parse_iso8601_utc("2024-01-01T00:00:00+999999999:0"), mx::StorageError);
  EXPECT_THROW(parse_iso8601_utc("2024-01-01T00:00:00+02:75"), mx::StorageError);
}

static std::string creds_json(const std::string& id, const std::string& expiration) {
  return "{\"Code\":\"Success\",\"Type\":\"AWS-HMAC\",\"AccessKeyId\":\"" + id +
         "\",\"SecretAccessKey\":\"sec-" + id + "\",\"Token\":\"tok-" + id +
         "\",\"Expiration\":\"" + expiration + "\"}";
}

TEST(S3Credentials, EnvironmentComesBeforeTheContainerEndpoint) {
  LocalServer s([&](const SeenRequest&) { return Reply{200, creds_json("C", "2099-01-01T00:00:00Z")}; });
  CredentialSources src;
  src.env = env_of({{"AWS_ACCESS_KEY_ID", "ENVKEY"}, {"AWS_SECRET_ACCESS_KEY", "ENVSECRET"},
                    {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/creds"}});
  src.container_host = s.url();
  src.imds_endpoint = s.url();
  DefaultCredentialsChain chain(src);
  EXPECT_EQ(chain.get().access_key_id, "ENVKEY");
  EXPECT_EQ(chain.source(), "environment");
  EXPECT_EQ(s.count(), 0u);
}

TEST(S3Credentials, ContainerRelativeUri) {
  LocalServer s([&](const SeenRequest&) { return Reply{200, creds_json("REL", "2099-01-01T00:00:00Z")}; });
  CredentialSources src;
  src.env = env_of({{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/7f3a"}});
  src.container_host = s.url();
  src.imds_endpoint = s.url();
  DefaultCredentialsChain chain(src);
  Credentials c = chain.get();
  EXPECT_EQ(c.access_key_id, "REL");
  EXPECT_EQ(c.secret_access_key, "sec-REL");
  EXPECT_EQ(c.session_token, "tok-REL");
  EXPECT_EQ(c.expiration, parse_iso8601_utc("2099-01-01T00:00:00Z"));
  EXPECT_EQ(chain.source(), "container");
  ASSERT_EQ(s.count(), 1u);
  EXPECT_EQ(s.requests()[0].target, "/v2/credentials/7f3a");
  EXPECT_EQ(s.requests()[0].headers.count("authorization"), 0u);
}

TEST(S3Credentials, ContainerFullUriWithAuthorizationToken) {
  LocalServer s([&](const SeenRequest& r) {
    if (r.headers.count("authorization") == 0 || r.headers.at("authorization") != "Bearer-abc")
      return Reply{401, "no"};
    return Reply{200, creds_json("FULL", "2099-01-01T00:00:00Z")};
  });
  CredentialSources src;
  src.env = env_of({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", s.url() + "/get-credentials"},
                    {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "Bearer-abc"}});
  src.imds_endpoint = s.url();
  EXPECT_EQ(DefaultCredentialsChain(src).get().access_key_id, "FULL");
  EXPECT_EQ(s.requests().at(0).target, "/get-credentials");

  CredentialSources remote = src;  // plain http to a non-local host is refused
  remote.env = env_of({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://example.com/creds"}});
  EXPECT_THROW(DefaultCredentialsChain(remote).get(), mx::UserError);
}

TEST(S3Credentials, ContainerFailuresNeverQuoteTheResponse) {
  LocalServer s([&](const SeenRequest&) { return Reply{200, "AccessKeyId=X SecretAccessKey=hunter2"}; });
  CredentialSources src;
  src.env = env_of({{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/c"}});
  src.container_host = s.url();
  try {
    DefaultCredentialsChain(src).get();
    FAIL();
  } catch (const mx::StorageError& e) {
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
  }
}

// The endpoint's Code is the body's too: shown only when it is a plain word.
TEST(S3Credentials, TheEndpointsCodeIsShownOnlyWhenItIsAWord) {
  for (const auto& [code, shown] : std::vector<std::pair<std::string, bool>>{
           {"Failed", true}, {"Failed:hunter2", false}, {"AccessDenied hunter2", false}}) {
    try {
      parse_credentials_json("{\"Code\": \"" + code + "\"}", "the endpoint");
      FAIL() << code;
    } catch (const mx::StorageError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find("hunter2"), std::string::npos) << m;
      EXPECT_EQ(m.find("Code=Failed") != std::string::npos, shown) << m;
    }
  }
}

// An Expiration that is not a time: the endpoint's failure (exit 3, was exit 2), not shown.
TEST(S3Credentials, AnExpirationThatIsNotATimeIsAStorageError) {
  for (const std::string& exp : {"tomorrow hunter2", "2099-13-01T00:00:00Z", "2099-01-01"}) {
    try {
      parse_credentials_json(creds_json("X", exp), "the endpoint");
      FAIL() << exp;
    } catch (const mx::StorageError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("Expiration"), std::string::npos) << m;
      EXPECT_EQ(m.find(exp), std::string::npos) << m;
    }
  }
}

// The role listing's body is the endpoint's: one that is not a role name (a credentials
// document, secret and all) was quoted in "credentials for role '...' failed".
TEST(S3Credentials, ARoleListingThatIsNotARoleNameIsNeverQuoted) {
  LocalServer s([&](const SeenRequest& r) {
    if (r.method == "PUT") return Reply{200, "TOKEN"};
    if (r.target == "/latest/meta-data/iam/security-credentials/")
      return Reply{200, "{\"AccessKeyId\":\"AKIAX\",\"SecretAccessKey\":\"hunter2\"}"};
    return Reply{404, ""};
  });
  CredentialSources src;
  src.env = env_of({});
  src.imds_endpoint = s.url();
  try {
    DefaultCredentialsChain(src).get();
    FAIL();
  } catch (const mx::StorageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("not an IAM role name"), std::string::npos) << m;
    EXPECT_EQ(m.find("hunter2"), std::string::npos) << m;
  }
  EXPECT_EQ(s.count(), 2u);  // the "role" is never asked for
}

TEST(S3Credentials, Imdsv2TokenThenRoleThenCredentials) {
  const std::string token = "IMDS-TOKEN-42";
  LocalServer s([&](const SeenRequest& r) {
    if (r.method == "PUT" && r.target == "/latest/api/token") {
      if (r.headers.count("x-aws-ec2-metadata-token-ttl-seconds") == 0) return Reply{400, ""};
      return Reply{200, token};
    }
    if (r.headers.count("x-aws-ec2-metadata-token") == 0 ||
        r.headers.at("x-aws-ec2-metadata-token") != token)
      return Reply{401, ""};  // IMDSv2 refuses token-less (v1) requests
    if (r.target == "/latest/meta-data/iam/security-credentials/") return Reply{200, "train-role"};
    if (r.target == "/latest/meta-data/iam/security-credentials/train-role")
      return Reply{200, creds_json("IMDS", "2099-01-01T00:00:00Z")};
    return Reply{404, ""};
  });
  CredentialSources src;
  src.env = env_of({});
  src.imds_endpoint = s.url();
  DefaultCredentialsChain chain(src);
  EXPECT_EQ(chain.get().access_key_id, "IMDS");
  EXPECT_EQ(chain.source(), "imds");
  auto seen = s.requests();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].method, "PUT");
  EXPECT_EQ(seen[1].target, "/latest/meta-data/iam/security-credentials/");
  EXPECT_EQ(seen[2].target, "/latest/meta-data/iam/security-credentials/train-role");
  // The documented override variable moves the endpoint too.
  CredentialSources via_env;
  via_env.env = env_of({{"AWS_EC2_METADATA_SERVICE_ENDPOINT", s.url() + "/"}});
  via_env.imds_endpoint = "http://127.0.0.1:1";  // would fail
  EXPECT_EQ(DefaultCredentialsChain(via_env).get().access_key_id, "IMDS");
}

TEST(S3Credentials, RefreshedBeforeExpirationAndKeptWhenRefreshFails) {
  std::atomic<int> fetches{0};
  std::atomic<bool> broken{false};
  const std::time_t t0 = 1700000000;
  LocalServer s([&](const SeenRequest&) {
    if (broken) return Reply{500, ""};
    int i = ++fetches;
    // Each answer expires 10 minutes after the fake clock's start.
    char exp[32];
    std::time_t e = t0 + 600 * i;
    std::tm tm{};
    gmtime_r(&e, &tm);
    std::strftime(exp, sizeof exp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return Reply{200, creds_json("K" + std::to_string(i), exp)};
  });
  std::time_t now = t0;
  CredentialSources src;
  src.env = env_of({{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/c"}});
  src.container_host = s.url();
  src.refresh_before_s = 300;
  src.now = [&] { return now; };
  DefaultCredentialsChain chain(src);
  EXPECT_EQ(chain.get().access_key_id, "K1");  // expires t0+600
  now = t0 + 200;
  EXPECT_EQ(chain.get().access_key_id, "K1");  // 400 s left: cached
  EXPECT_EQ(fetches.load(), 1);
  now = t0 + 400;
  EXPECT_EQ(chain.get().access_key_id, "K2");  // 200 s left: refreshed (expires t0+1200)
  EXPECT_EQ(fetches.load(), 2);
  broken = true;
  now = t0 + 1000;  // inside the refresh window, refresh fails, K2 still valid
  testing::internal::CaptureStderr();
  EXPECT_EQ(chain.get().access_key_id, "K2");
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("refreshing S3 credentials failed"), std::string::npos);
  EXPECT_EQ(log.find("sec-K2"), std::string::npos);
  now = t0 + 1300;  // expired and the endpoint still fails
  EXPECT_THROW(chain.get(), mx::StorageError);
}

TEST(S3Credentials, NoSourceIsAUserError) {
  CredentialSources src;
  src.env = env_of({{"AWS_EC2_METADATA_DISABLED", "true"}});
  src.imds_endpoint = "http://127.0.0.1:1";
  try {
    DefaultCredentialsChain(src).get();
    FAIL();
  } catch (const mx::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no AWS credentials found"), std::string::npos);
  }
  // Without IMDS answering (not on EC2): the same, quickly.
  CredentialSources no_imds;
  no_imds.env = env_of({});
  no_imds.imds_endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  auto t = std::chrono::steady_clock::now();
  EXPECT_THROW(DefaultCredentialsChain(no_imds).get(), mx::UserError);
  EXPECT_LT(std::chrono::steady_clock::now() - t, std::chrono::seconds(5));
}
