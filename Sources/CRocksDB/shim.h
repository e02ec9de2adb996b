#ifndef ENCORE_CROCKSDB_SHIM_H
#define ENCORE_CROCKSDB_SHIM_H
#include <rocksdb/c.h>
#endif
