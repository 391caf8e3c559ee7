#!/usr/bin/env python3
"""Writes tools/traces/chaining.jsonl and tools/traces/chaining-dpdk.jsonl:
AES-CBC + HMAC-SHA1 / HMAC-SHA-256 algorithm-chaining requests for
vhost-crypto-replay.

Expected values come from Python's `cryptography` (AES-CBC, OpenSSL
backend) and the standard library's `hmac`/`hashlib`, never from the
project's code. Data is from a seeded PRNG, so the files are reproducible:

    python3 tools/traces/src/chaining.py

chaining.jsonl: both MACs and directions, truncated digests, partial
cipher and hash ranges, in-place and out-of-place requests, forged and
truncated digests on decrypt (ERR), hostile chaining fields (ERR) and
refused session parameters.

chaining-dpdk.jsonl: what DPDK 22.11's vhost_crypto can be compared on
(docs/PROTOCOL.md §9): in-place requests, len_to_cipher =
src_data_len - cipher_start_src_offset, payloads up to 2048 bytes, no
request DPDK would reject (it never completes those); forged digests are
in (DPDK completes them with ERR). Run with
`vhost-crypto-replay --dpdk-diff SOCK` or `--dpdk`.
"""
import hashlib
import hmac
import json
import os
import random

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20261130)


def rbytes(n):
    return bytes(rng.getrandbits(8) for _ in range(n))


def cbc(encrypt, key, iv, data):
    c = Cipher(algorithms.AES(key), modes.CBC(iv))
    op = c.encryptor() if encrypt else c.decryptor()
    return op.update(data) + op.finalize()


def mac(name, key, data):
    h = hashlib.sha1 if name == "hmac-sha1" else hashlib.sha256
    return hmac.new(key, data, h).digest()


class Writer:
    def __init__(self):
        self.out = []
        self.sessions = {}

    def comment(self, text):
        self.out.append("# " + text)

    def line(self, obj):
        self.out.append(json.dumps(obj, separators=(",", ":")))

    def session(self, name, direction, key, mac_name, auth_key, digest_len, **extra):
        obj = {"op": "create_session", "name": name, "algo": "aes-cbc", "key": key.hex(),
               "direction": direction, "mac": mac_name, "auth_key": auth_key.hex(),
               "digest_len": digest_len}
        obj.update(extra)
        self.line(obj)
        self.sessions[name] = (direction, key, mac_name, auth_key, digest_len)

    def request(self, name, size, c_off, c_len, h_off, h_len, in_place=False, forge=None, expect_err=False,
                fields=None):
        """A chained request on session `name`; `forge` modifies the
        supplied digest on decrypt (the request then expects ERR)."""
        direction, key, mac_name, auth_key, dl = self.sessions[name]
        iv = rbytes(16)
        msg = rbytes(size)
        obj = {"op": "request", "session": name, "opcode": direction, "iv": iv.hex(),
               "cipher_offset": c_off, "cipher_len": c_len, "hash_offset": h_off, "hash_len": h_len}
        if direction == "encrypt":
            dst = msg[:c_off] + cbc(True, key, iv, msg[c_off:c_off + c_len]) + msg[c_off + c_len:]
            tag = mac(mac_name, auth_key, dst[h_off:h_off + h_len])[:dl]
            obj["src"] = msg.hex()
            expect = {"status": "ok", "dst": dst.hex(), "digest": tag.hex()}
        else:
            # src is the ciphertext of msg; the driver supplies the MAC of src.
            src = msg[:c_off] + cbc(True, key, iv, msg[c_off:c_off + c_len]) + msg[c_off + c_len:]
            tag = mac(mac_name, auth_key, src[h_off:h_off + h_len])[:dl]
            obj["src"] = src.hex()
            if forge is not None:
                tag = forge(tag)
                expect = {"status": "err"}
            else:
                expect = {"status": "ok", "dst": msg.hex()}
            obj["digest"] = tag.hex()
        if expect_err:
            expect = {"status": "err"}
        if in_place:
            obj["in_place"] = True
        if fields:
            obj.update(fields)
        obj["expect"] = expect
        self.line(obj)

    def write(self, path):
        with open(path, "w") as f:
            f.write("\n".join(self.out) + "\n")


def flip(byte, bit):
    def f(tag):
        t = bytearray(tag)
        t[byte] ^= 1 << bit
        return bytes(t)
    return f


def sessions(w):
    k128, k256 = rbytes(16), rbytes(32)
    a20, a100 = rbytes(20), rbytes(100)
    w.comment("AES-128-CBC + HMAC-SHA1 truncated to 12 bytes (IPsec's HMAC-SHA1-96)")
    w.session("e1", "encrypt", k128, "hmac-sha1", a20, 12)
    w.session("d1", "decrypt", k128, "hmac-sha1", a20, 12)
    w.comment("AES-256-CBC + HMAC-SHA-256: full 32-byte tag on encrypt, 16 on decrypt; 100-byte auth key (hashed first)")
    w.session("e2", "encrypt", k256, "hmac-sha256", a100, 32)
    w.session("d2", "decrypt", k256, "hmac-sha256", a100, 16)
    w.comment("AES-128-CBC + full HMAC-SHA1")
    w.session("e3", "encrypt", k128, "hmac-sha1", a20, 20)
    w.session("d3", "decrypt", k128, "hmac-sha1", a20, 20)


def dpdk_requests(w):
    """In place, len_to_cipher = size - cipher_offset."""
    for name in ["e1", "d1", "e2", "d2", "e3", "d3"]:
        for size, c_off, h_off, h_len in [(64, 0, 0, 64), (256, 16, 0, 256), (1024, 32, 8, 1000),
                                          (1500, 12, 0, 1500), (2048, 0, 0, 2048)]:
            w.request(name, size, c_off, size - c_off, h_off, h_len, in_place=True)
    w.comment("forged digests on decrypt: ERR, dst untouched")
    for name in ["d1", "d2", "d3"]:
        dl = w.sessions[name][4]
        for byte, bit in [(0, 0), (dl - 1, 7)]:
            w.request(name, 256, 16, 240, 0, 256, in_place=True, forge=flip(byte, bit))
        w.request(name, 256, 16, 240, 0, 256, in_place=True)


def main():
    w = Writer()
    w.comment("Generated by tools/traces/src/chaining.py (expected values: Python cryptography + hmac)")
    sessions(w)
    w.comment("out-of-place requests: dst bytes outside the cipher range carry src")
    for name in ["e1", "d1", "e2", "d2", "e3", "d3"]:
        for size, c_off, c_len, h_off, h_len in [(16, 0, 16, 0, 16), (256, 16, 224, 0, 256),
                                                (512, 48, 400, 7, 300), (1500, 12, 1488, 0, 1500),
                                                (4096, 0, 4096, 100, 3996), (80, 64, 16, 0, 0)]:
            w.request(name, size, c_off, c_len, h_off, h_len)
    w.comment("in-place requests (DPDK's guest driver)")
    dpdk_requests(w)
    w.comment("truncated digest supplied on decrypt (the last byte is the canary): ERR")
    w.request("d2", 256, 0, 256, 0, 256, forge=lambda t: t[:-1])
    w.comment("hostile chaining fields: ERR, dst untouched")
    for f in [{"cipher_offset": 16, "cipher_len": 256},
              {"cipher_offset": 4294967280, "cipher_len": 32},
              {"cipher_len": 17},
              {"hash_offset": 1, "hash_len": 256},
              {"hash_len": 4294967295},
              {"hash_offset": 4294967295, "hash_len": 2},
              {"digest_len": 21},
              {"digest_len": 33},
              {"digest_len": 11}]:
        w.request("e1", 256, 0, 256, 0, 256, expect_err=True, fields=f)
    w.comment("refused session parameters (negative id)")
    k, a = rbytes(16), rbytes(20)
    for extra in [{"digest_len": 21}, {"digest_len": 0}, {"chain_order": "hash_then_cipher"}]:
        obj = {"op": "create_session", "name": "bad", "algo": "aes-cbc", "key": k.hex(), "direction": "encrypt",
               "mac": "hmac-sha1", "auth_key": a.hex(), "digest_len": 20, "expect": {"status": "err"}}
        obj.update(extra)
        w.line(obj)
    obj = {"op": "create_session", "name": "bad", "algo": "aes-cbc", "key": k.hex(), "direction": "encrypt",
           "mac": "hmac-sha256", "auth_key": rbytes(513).hex(), "expect": {"status": "err"}}
    w.line(obj)
    for name in ["e1", "d1", "e2", "d2", "e3", "d3"]:
        w.line({"op": "close_session", "name": name})
    w.write(os.path.join(HERE, "..", "chaining.jsonl"))

    d = Writer()
    d.comment("Generated by tools/traces/src/chaining.py: chained requests DPDK 22.11's vhost_crypto can be compared on")
    sessions(d)
    dpdk_requests(d)
    for name in ["e1", "d1", "e2", "d2", "e3", "d3"]:
        d.line({"op": "close_session", "name": name})
    d.write(os.path.join(HERE, "..", "chaining-dpdk.jsonl"))


if __name__ == "__main__":
    main()
