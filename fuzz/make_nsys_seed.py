#!/usr/bin/env python3
"""Writes the seed of fuzz_import_nsys: a small SQLite file in the documented `nsys export --type
sqlite` schema (the tables import_nsys reads), two processes on two GPUs with kernels on two
streams, an NCCL all-reduce kernel, a memcpy, runtime calls and NVTX step ranges.

    python3 fuzz/make_nsys_seed.py fuzz/corpus/fuzz_import_nsys/two-ranks.sqlite
"""
import os
import sqlite3
import sys

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL, name TEXT, busLocation TEXT);
CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
  shortName INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
  correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
  eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
  returnValue INTEGER NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
  text TEXT, globalTid INTEGER, textId INTEGER);
"""

HW = 1 << 56  # hardware-id bits above the pid in nsys global ids


def gpid(pid):
    return HW | (pid << 24)


def main(path):
    if os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [
        (1, "sgemm_kernel"), (2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"), (3, "forward"),
        (4, "cudaLaunchKernel_v7000"), (5, "python3")])
    db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '')")
    db.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H100', '0000:01:00.0')")
    a, b = gpid(7000), gpid(5000)
    at, bt = a | 7001, b | 5001
    db.execute("INSERT INTO ThreadNames VALUES (5, 0, ?)", (at,))
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,?,?,?,?,?,?,?)", [
        (1000, 5000, 0, 1, 7, 1, a, 1, 1), (4000, 8000, 0, 1, 13, 2, a, 2, 2),
        (11000, 14000, 0, 1, 7, 3, a, 1, 1), (1000, 5000, 1, 1, 7, 1, b, 1, 1),
        (4500, 8000, 1, 1, 13, 2, b, 2, 2)])
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (500, 900, 0, 1, 7, 9, ?, 4096, 1)", (a,))
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?)", [
        (800, 810, 0, at, 1, 4, 0), (900, 910, 0, at, 2, 4, 0), (10500, 10510, 0, at, 3, 4, 0),
        (800, 810, 0, bt, 1, 4, 0), (900, 910, 0, bt, 2, 4, 0)])
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?,?,?,?,?,?)", [
        (0, 10000, 59, "step 0", at, None), (10000, 20000, 59, "step 1", at, None),
        (100, 3000, 59, None, at, 3)])
    db.commit()
    db.execute("VACUUM")
    db.close()


if __name__ == "__main__":
    main(sys.argv[1])
