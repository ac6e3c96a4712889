// Known answers from published references: FIPS 180-2 (SHA-256), RFC 4231 (HMAC-SHA256),
// RFC 1321 (MD5), and the AWS documentation's SigV4 examples for S3 ("Signature Calculations
// for the Authorization Header: Transferring Payload in a Single Chunk") and for the signing
// key (AWS General Reference, "Examples of how to derive a signing key").
#include <gtest/gtest.h>

#include "checkpoint/s3/crypto.h"
#include "checkpoint/s3/sigv4.h"

using namespace mx::s3;

TEST(S3Crypto, Sha256Fips180Vectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(S3Crypto, HmacSha256Rfc4231Vectors) {
  EXPECT_EQ(to_hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than the block size is hashed first.
  EXPECT_EQ(to_hex(hmac_sha256(std::string(131, '\xaa'),
                               "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(S3Crypto, Md5AndBase64) {
  EXPECT_EQ(to_hex(md5("", 0)), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(to_hex(md5("abc", 3)), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(base64(md5("", 0)), "1B2M2Y8AsgTpgAmY7PhCfg==");
  EXPECT_EQ(base64(""), "");
  EXPECT_EQ(base64("f"), "Zg==");
  EXPECT_EQ(base64("fo"), "Zm8=");
  EXPECT_EQ(base64("foobar"), "Zm9vYmFy");  // RFC 4648 section 10
}

TEST(S3SigV4, SigningKeyFromGeneralReference) {
  EXPECT_EQ(to_hex(signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1",
                               "iam")),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
}

TEST(S3SigV4, UriEncode) {
  EXPECT_EQ(uri_encode("test$file.text", true), "test%24file.text");
  EXPECT_EQ(uri_encode("a b/c~d_e-f.g", true), "a%20b/c~d_e-f.g");
  EXPECT_EQ(uri_encode("a b/c", false), "a%20b%2Fc");
  EXPECT_EQ(uri_encode("\xc3\xa9+=&", false), "%C3%A9%2B%3D%26");
  EXPECT_EQ(canonical_query({{"prefix", "J"}, {"max-keys", "2"}}), "max-keys=2&prefix=J");
  EXPECT_EQ(canonical_query({{"lifecycle", ""}}), "lifecycle=");
  EXPECT_EQ(amz_date(1369353600), "20130524T000000Z");
  // botocore 1.43's canonical request for the same key and listing (S3SigV4Auth, logged):
  //   PUT /bkt/dir/a%20b%2Bc%3Dd%26e~f%281%29.bin   and   ...&prefix=listing%2F
  EXPECT_EQ("/bkt/" + uri_encode("dir/a b+c=d&e~f(1).bin", true),
            "/bkt/dir/a%20b%2Bc%3Dd%26e~f%281%29.bin");
  EXPECT_EQ(canonical_query({{"prefix", "listing/"}, {"max-keys", "10"}, {"list-type", "2"},
                             {"encoding-type", "url"}}),
            "encoding-type=url&list-type=2&max-keys=10&prefix=listing%2F");
}

namespace {

const Credentials kExampleCreds{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                                "", 0};
const char* kDate = "20130524T000000Z";

SigningInput example(const std::string& method, const std::string& path) {
  SigningInput in;
  in.method = method;
  in.encoded_path = path;
  in.headers = {{"Host", "examplebucket.s3.amazonaws.com"}};
  return in;
}

}  // namespace

TEST(S3SigV4, AwsExampleGetObjectWithRange) {
  SigningInput in = example("GET", "/test.txt");
  in.headers.emplace_back("Range", "bytes=0-9");
  in.payload_sha256_hex = kEmptyPayloadSha256;
  add_signing_headers(in, kExampleCreds, kDate);
  Signature s = sign_v4(in, kExampleCreds, "us-east-1", "s3", kDate);
  EXPECT_EQ(s.canonical_request,
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(s.signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(S3SigV4, AwsExamplePutObject) {
  const std::string payload = "Welcome to Amazon S3.";
  SigningInput in = example("PUT", "/" + uri_encode("test$file.text", true));
  in.headers.emplace_back("Date", "Fri, 24 May 2013 00:00:00 GMT");
  in.headers.emplace_back("x-amz-storage-class", "REDUCED_REDUNDANCY");
  in.payload_sha256_hex = sha256_hex(payload);
  EXPECT_EQ(in.payload_sha256_hex,
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  add_signing_headers(in, kExampleCreds, kDate);
  Signature s = sign_v4(in, kExampleCreds, "us-east-1", "s3", kDate);
  EXPECT_EQ(s.signed_headers, "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class");
  EXPECT_EQ(s.signature, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(S3SigV4, AwsExampleGetBucketLifecycle) {
  SigningInput in = example("GET", "/");
  in.query = {{"lifecycle", ""}};
  in.payload_sha256_hex = kEmptyPayloadSha256;
  add_signing_headers(in, kExampleCreds, kDate);
  Signature s = sign_v4(in, kExampleCreds, "us-east-1", "s3", kDate);
  EXPECT_EQ(s.signature, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(S3SigV4, AwsExampleListObjects) {
  SigningInput in = example("GET", "/");
  in.query = {{"max-keys", "2"}, {"prefix", "J"}};
  in.payload_sha256_hex = kEmptyPayloadSha256;
  add_signing_headers(in, kExampleCreds, kDate);
  Signature s = sign_v4(in, kExampleCreds, "us-east-1", "s3", kDate);
  EXPECT_EQ(s.signature, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(S3SigV4, SessionTokenIsSignedAndAnyChangeChangesTheSignature) {
  Credentials with_token = kExampleCreds;
  with_token.session_token = "FQoGZXIvYXdzEXAMPLETOKEN";
  SigningInput in = example("GET", "/test.txt");
  in.payload_sha256_hex = kEmptyPayloadSha256;
  SigningInput plain = in;
  add_signing_headers(in, with_token, kDate);
  add_signing_headers(plain, kExampleCreds, kDate);
  Signature s = sign_v4(in, with_token, "us-east-1", "s3", kDate);
  Signature p = sign_v4(plain, kExampleCreds, "us-east-1", "s3", kDate);
  EXPECT_EQ(s.signed_headers, "host;x-amz-content-sha256;x-amz-date;x-amz-security-token");
  EXPECT_NE(s.signature, p.signature);
  // Header values are trimmed and inner spaces collapsed before signing.
  SigningInput spaced = example("GET", "/test.txt");
  spaced.headers[0].second = "  examplebucket.s3.amazonaws.com ";
  spaced.payload_sha256_hex = kEmptyPayloadSha256;
  add_signing_headers(spaced, kExampleCreds, kDate);
  EXPECT_EQ(sign_v4(spaced, kExampleCreds, "us-east-1", "s3", kDate).signature, p.signature);
  EXPECT_NE(sign_v4(plain, kExampleCreds, "us-west-2", "s3", kDate).signature, p.signature);
}
