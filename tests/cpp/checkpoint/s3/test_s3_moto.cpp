// The S3 client against a real S3 implementation: a moto server on 127.0.0.1 with SigV4
// checking on. The test starts it (python3 with moto and boto3; MXTRAIN_TEST_PYTHON overrides
// the interpreter), creates an IAM user whose key may use S3, then switches moto to check every
// request's signature (POST /moto-api/reset-auth 0, the server-mode form of
// INITIAL_NO_AUTH_ACTION_COUNT=0). boto3 in the helper process is the independent reference:
// it reads what our client wrote and writes what our client reads.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <random>

#include "checkpoint/s3/client.h"
#include "checkpoint/s3/crypto.h"
#include "core/error.h"

using namespace mx::s3;

namespace {

const char* kHelper = R"PY(
import json, socket, sys, hashlib
try:
    import boto3, requests
    from moto.server import ThreadedMotoServer
except Exception as e:
    print(json.dumps({"skip": "moto/boto3 not importable: %r" % (e,)}), flush=True)
    sys.exit(0)
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
server.start()
ep = "http://127.0.0.1:%d" % port
boot = dict(endpoint_url=ep, region_name="us-east-1",
            aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
iam = boto3.client("iam", **boot)
iam.create_user(UserName="mxtrain")
iam.put_user_policy(UserName="mxtrain", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="mxtrain")["AccessKey"]
# From here on every request must carry a valid signature of a known IAM key.
requests.post(ep + "/moto-api/reset-auth", data=b"0").raise_for_status()
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1",
                  aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
s3.create_bucket(Bucket="mx-ckpt")
print(json.dumps({"endpoint": ep, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"],
                  "bucket": "mx-ckpt"}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    try:
        if cmd["op"] == "digest":
            body = s3.get_object(Bucket="mx-ckpt", Key=cmd["key"])["Body"].read()
            out = {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
        elif cmd["op"] == "put":
            data = open(cmd["path"], "rb").read()
            out = {"etag": s3.put_object(Bucket="mx-ckpt", Key=cmd["key"], Body=data)["ETag"]}
        elif cmd["op"] == "keys":
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket="mx-ckpt", Prefix=cmd["prefix"])
            out = {"keys": [o["Key"] for p in pages for o in p.get("Contents", [])]}
        elif cmd["op"] == "uploads":
            out = {"count": len(s3.list_multipart_uploads(Bucket="mx-ckpt").get("Uploads", []))}
        else:
            out = {"error": "unknown op"}
    except Exception as e:
        out = {"error": repr(e)}
    print(json.dumps(out), flush=True)
server.stop()
)PY";

// The helper process: its stdin takes JSON commands, its stdout answers one line each.
class MotoHelper {
 public:
  bool start(std::string& why) {
    const char* py = std::getenv("MXTRAIN_TEST_PYTHON");
    std::string python = py && *py ? py : "python3";
    int in[2], out[2];
    if (::pipe(in) != 0 || ::pipe(out) != 0) {
      why = "pipe failed";
      return false;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 2);  // werkzeug's request log
      ::close(in[1]);
      ::close(out[0]);
      ::execlp(python.c_str(), python.c_str(), "-c", kHelper, (char*)nullptr);
      std::printf("{\"skip\": \"cannot run %s\"}\n", python.c_str());
      std::fflush(stdout);
      ::_exit(0);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = ::fdopen(in[1], "w");
    from_ = ::fdopen(out[0], "r");
    std::string first = read_line();
    if (first.empty()) {
      why = "the moto helper exited without a word (python3 with moto and boto3 needed)";
      return false;
    }
    info_ = nlohmann::json::parse(first);
    if (info_.contains("skip")) {
      why = info_["skip"].get<std::string>();
      return false;
    }
    return true;
  }
  ~MotoHelper() {
    if (to_) std::fclose(to_);  // EOF on stdin: the helper stops its server and exits
    if (from_) std::fclose(from_);
    if (pid_ > 0) {
      for (int i = 0; i < 50; ++i) {
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
        ::usleep(100000);
      }
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  nlohmann::json call(const nlohmann::json& cmd) {
    std::string line = cmd.dump() + "\n";
    std::fputs(line.c_str(), to_);
    std::fflush(to_);
    auto out = nlohmann::json::parse(read_line());
    if (out.contains("error")) ADD_FAILURE() << "boto3 helper: " << out["error"];
    return out;
  }
  const nlohmann::json& info() const { return info_; }

 private:
  std::string read_line() {
    std::string s;
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') s += static_cast<char>(c);
    return s;
  }
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  nlohmann::json info_;
};

std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = g();
    std::memcpy(&s[i], &v, std::min<size_t>(8, n - i));
  }
  return s;
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "mx_s3_" + std::to_string(::getpid()) + "_" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

class S3Moto : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    helper_ = new MotoHelper();
    if (!helper_->start(skip_reason_)) {
      delete helper_;
      helper_ = nullptr;
    }
  }
  static void TearDownTestSuite() {
    delete helper_;
    helper_ = nullptr;
  }
  void SetUp() override {
    if (!helper_) GTEST_SKIP() << "moto server unavailable: " << skip_reason_;
  }
  static S3Config config() {
    S3Config c;
    c.endpoint_url = helper_->info()["endpoint"];
    c.part_size = 5ull << 20;
    c.multipart_threshold = 5ull << 20;
    c.download_chunk = 3ull << 20;
    c.parallelism = 3;
    c.retry = RetryPolicy{3, 0.01, 0.1};
    return c;
  }
  static Credentials creds() {
    return Credentials{helper_->info()["key"], helper_->info()["secret"], "", 0};
  }
  static S3Client client() { return S3Client(config(), std::make_shared<StaticCredentials>(creds())); }
  static std::string bucket() { return helper_->info()["bucket"]; }
  static std::string digest(const std::string& key) { return helper_->call({{"op", "digest"}, {"key", key}})["sha256"]; }

  static MotoHelper* helper_;
  static std::string skip_reason_;
};
MotoHelper* S3Moto::helper_ = nullptr;
std::string S3Moto::skip_reason_;

TEST_F(S3Moto, PutGetHeadRangeDelete) {
  S3Client c = client();
  const std::string data = random_bytes(100000, 1);
  const std::string key = "run1/step_00000100/model.safetensors";
  std::string etag = c.put_object(bucket(), key, data.data(), data.size());
  EXPECT_EQ(etag, to_hex(md5(data.data(), data.size())));
  EXPECT_EQ(digest(key), sha256_hex(data));  // boto3 reads back what we wrote

  EXPECT_EQ(c.get_object(bucket(), key), data);
  auto info = c.head_object(bucket(), key);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->size, data.size());
  EXPECT_EQ(info->etag, etag);
  EXPECT_EQ(c.get_range(bucket(), key, 12345, 999), data.substr(12345, 999));
  EXPECT_EQ(c.get_range(bucket(), key, data.size() - 7, 7), data.substr(data.size() - 7));
  EXPECT_THROW(c.get_range(bucket(), key, data.size() - 7, 8), mx::StorageError);

  c.delete_object(bucket(), key);
  EXPECT_FALSE(c.head_object(bucket(), key).has_value());
  c.delete_object(bucket(), key);  // deleting a missing key is fine
  try {
    c.get_object(bucket(), key);
    FAIL();
  } catch (const mx::StorageError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("GetObject s3://mx-ckpt/" + key), std::string::npos) << m;
    EXPECT_NE(m.find("NoSuchKey"), std::string::npos) << m;
  }
}

TEST_F(S3Moto, KeysWithSpecialCharactersAndEmptyObjects) {
  S3Client c = client();
  // moto 5.2's signature check rebuilds the canonical request from a partly decoded URL
  // (%2B, %3D, %26, %28, %2F in queries, UTF-8 escapes...), so keys with those characters fail
  // there for boto3 as well; their encoding is checked against botocore's canonical request in
  // test_s3_crypto_sigv4.cpp. Here: spaces and the unreserved punctuation.
  for (std::string key : {"dir/a b~c_d-e.f.bin", "step 00000100/shard 0 of 8", "empty"}) {
    std::string data = key == "empty" ? "" : "payload of " + key;
    c.put_object(bucket(), key, data.data(), data.size());
    EXPECT_EQ(digest(key), sha256_hex(data)) << key;
    EXPECT_EQ(c.get_object(bucket(), key), data) << key;
  }
  // Written by boto3, read by us.
  const std::string path = temp_path("boto3.bin");
  const std::string data = random_bytes(777, 9);
  std::ofstream(path, std::ios::binary) << data;
  helper_->call({{"op", "put"}, {"key", "from boto3/x.bin"}, {"path", path}});
  EXPECT_EQ(c.get_object(bucket(), "from boto3/x.bin"), data);
  std::remove(path.c_str());
}

TEST_F(S3Moto, MultipartUploadAndChunkedDownloadsAreByteExact) {
  S3Client c = client();
  const std::string data = random_bytes((12u << 20) + 123, 2);  // 3 parts of 5, 5, 2 MiB
  const std::string key = "big/shard-00000-of-00001.safetensors";
  std::string etag = c.upload(bucket(), key, data.data(), data.size());
  EXPECT_EQ(etag.substr(etag.size() - 2), "-3") << etag;
  EXPECT_EQ(digest(key), sha256_hex(data));
  EXPECT_EQ(c.head_object(bucket(), key)->size, data.size());

  // Parallel ranged GETs into a file (3 MiB chunks, not aligned with the 5 MiB parts).
  const std::string path = temp_path("download.bin");
  EXPECT_EQ(c.download_file(bucket(), key, path), data.size());
  EXPECT_TRUE(read_file(path) == data);
  EXPECT_FALSE(std::ifstream(path + ".partial").good());
  // Streaming, in order.
  std::string streamed;
  EXPECT_EQ(c.download(bucket(), key, [&](const uint8_t* p, size_t n) {
    streamed.append(reinterpret_cast<const char*>(p), n);
  }), data.size());
  EXPECT_TRUE(streamed == data);
  // A range across the part boundary.
  EXPECT_EQ(c.get_range(bucket(), key, (5u << 20) - 10, 20), data.substr((5u << 20) - 10, 20));

  // The same through upload_file (pread per part).
  std::ofstream(path, std::ios::binary) << data;
  c.upload_file(bucket(), "big/from-file", path);
  EXPECT_EQ(digest("big/from-file"), sha256_hex(data));
  std::remove(path.c_str());
  EXPECT_EQ(helper_->call({{"op", "uploads"}})["count"], 0);
}

TEST_F(S3Moto, FailedMultipartUploadIsAborted) {
  S3Client c = client();
  const std::string data = random_bytes(11u << 20, 3);
  std::atomic<int> reads{0};
  EXPECT_THROW(c.upload_parts(bucket(), "broken", data.size(),
                              [&](uint64_t off, size_t, std::vector<uint8_t>&) -> const uint8_t* {
                                if (++reads == 2) throw mx::StorageError("disk read failed");
                                return reinterpret_cast<const uint8_t*>(data.data()) + off;
                              }),
               mx::StorageError);
  EXPECT_EQ(helper_->call({{"op", "uploads"}})["count"], 0);
  EXPECT_FALSE(c.head_object(bucket(), "broken").has_value());
}

TEST_F(S3Moto, ListingWithContinuation) {
  S3Client c = client();
  std::vector<std::string> keys;
  for (int i = 0; i < 23; ++i) {
    char k[64];
    std::snprintf(k, sizeof k, "listing-step_%08d.part %d", i * 7, i);
    keys.push_back(k);
    c.put_object(bucket(), k, k, std::strlen(k));
  }
  c.put_object(bucket(), "listinG-other", "x", 1);  // not under the prefix
  c.put_object(bucket(), "listing", "x", 1);        // a prefix of the prefix
  std::vector<std::string> got;
  std::vector<size_t> page_sizes;
  std::string token;
  do {
    ListPage p = c.list_objects_v2(bucket(), "listing-", token, 10);
    page_sizes.push_back(p.objects.size());
    for (const auto& o : p.objects) {
      got.push_back(o.key);
      EXPECT_EQ(o.size, o.key.size());
    }
    token = p.next_continuation_token;
  } while (!token.empty());
  EXPECT_EQ(page_sizes, (std::vector<size_t>{10, 10, 3}));
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(got, keys);
  auto boto = helper_->call({{"op", "keys"}, {"prefix", "listing-"}})["keys"].get<std::vector<std::string>>();
  EXPECT_EQ(got, boto);
  EXPECT_EQ(c.list_all(bucket(), "listing-").size(), 23u);
  ListPage dirs = c.list_objects_v2(bucket(), "listing-", "", 1000, ".");
  EXPECT_EQ(dirs.common_prefixes.size(), 23u);
  EXPECT_TRUE(dirs.objects.empty());
}

TEST_F(S3Moto, WrongCredentialsAreAClearUserErrorWithoutSecrets) {
  Credentials bad = creds();
  bad.secret_access_key = "WrongSecretKeyForTheTest0123456789abcdef";
  S3Client c(config(), std::make_shared<StaticCredentials>(bad));
  testing::internal::CaptureStderr();
  try {
    c.put_object(bucket(), "denied/key", "abc", 3);
    FAIL() << "a wrong secret key was accepted";
  } catch (const mx::UserError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("PutObject s3://mx-ckpt/denied/key"), std::string::npos) << m;
    EXPECT_NE(m.find("SignatureDoesNotMatch"), std::string::npos) << m;
    EXPECT_EQ(m.find(bad.secret_access_key), std::string::npos) << m;
    EXPECT_EQ(m.find(creds().secret_access_key), std::string::npos) << m;
    EXPECT_EQ(m.find(creds().access_key_id), std::string::npos) << m;
  }
  Credentials unknown{"AKIAUNKNOWNKEY000000", "whatever-secret-value", "", 0};
  S3Client u(config(), std::make_shared<StaticCredentials>(unknown));
  try {
    u.get_object(bucket(), "k");
    FAIL();
  } catch (const mx::UserError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("InvalidAccessKeyId"), std::string::npos) << m;
    EXPECT_EQ(m.find("whatever-secret-value"), std::string::npos) << m;
    EXPECT_EQ(m.find(unknown.access_key_id), std::string::npos) << m;
  }
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find(bad.secret_access_key), std::string::npos);
  // A bucket that does not exist is configuration too.
  EXPECT_THROW(client().get_object("no-such-bucket-here", "k"), mx::UserError);
}
