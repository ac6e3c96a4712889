"""A moto S3 server on 127.0.0.1 with SigV4 checking on, for the checkpoint tests.

Run by a Python that has moto and boto3 (the pyenv `python3` on PATH; MXTRAIN_TEST_PYTHON
overrides), as a child of the test: it creates an IAM user allowed s3:*, switches moto to check
every request's signature (POST /moto-api/reset-auth 0, the server-mode form of
INITIAL_NO_AUTH_ACTION_COUNT=0), creates the bucket, prints one JSON line (endpoint, key,
secret, bucket), then answers JSON commands on stdin with boto3 (the independent client) until
stdin closes, and stops the server.
"""
import hashlib
import json
import socket
import sys


def main():
    try:
        import boto3
        import requests
        from moto.server import ThreadedMotoServer
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"skip": f"moto/boto3 not importable: {e!r}"}), flush=True)
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    ep = f"http://127.0.0.1:{port}"
    boot = dict(endpoint_url=ep, region_name="us-east-1",
                aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    iam = boto3.client("iam", **boot)
    iam.create_user(UserName="mxtrain")
    iam.put_user_policy(UserName="mxtrain", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="mxtrain")["AccessKey"]
    requests.post(ep + "/moto-api/reset-auth", data=b"0").raise_for_status()
    s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1",
                      aws_access_key_id=key["AccessKeyId"],
                      aws_secret_access_key=key["SecretAccessKey"])
    bucket = "mx-ckpt"
    s3.create_bucket(Bucket=bucket)
    print(json.dumps({"endpoint": ep, "key": key["AccessKeyId"],
                      "secret": key["SecretAccessKey"], "bucket": bucket}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            op = cmd["op"]
            if op == "keys":
                pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=cmd["prefix"])
                out = {"objects": [{"key": o["Key"], "size": o["Size"],
                                    "etag": o["ETag"].strip('"')}
                                   for p in pages for o in p.get("Contents", [])]}
            elif op == "download":
                body = s3.get_object(Bucket=bucket, Key=cmd["key"])["Body"].read()
                with open(cmd["path"], "wb") as f:
                    f.write(body)
                out = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
            elif op == "put":
                with open(cmd["path"], "rb") as f:
                    data = f.read()
                out = {"etag": s3.put_object(Bucket=bucket, Key=cmd["key"], Body=data)["ETag"]}
            elif op == "delete":
                s3.delete_object(Bucket=bucket, Key=cmd["key"])
                out = {}
            elif op == "uploads":
                ups = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
                out = {"count": len(ups), "keys": sorted(u["Key"] for u in ups),
                       "ids": sorted([u["Key"], u["UploadId"]] for u in ups)}
            elif op == "abort_uploads":
                for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
                    if u["Key"] in cmd["keys"]:
                        s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"],
                                                  UploadId=u["UploadId"])
                out = {}
            elif op == "start_upload":  # an upload left open, as a killed writer leaves it
                uid = s3.create_multipart_upload(Bucket=bucket, Key=cmd["key"])["UploadId"]
                s3.upload_part(Bucket=bucket, Key=cmd["key"], UploadId=uid, PartNumber=1,
                               Body=b"x" * 1024)
                out = {"upload_id": uid}
            else:
                out = {"error": f"unknown op {op}"}
        except Exception as e:  # noqa: BLE001
            out = {"error": repr(e)}
        print(json.dumps(out), flush=True)
    server.stop()


if __name__ == "__main__":
    main()
