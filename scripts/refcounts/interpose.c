// Counts the reference-count operations a Swift process makes through the dynamic linker:
// swift_retain, swift_release, the string (bridge object) variants and their _n forms (counted
// n times), and its object allocations (swift_allocObject: instances, array and string buffers,
// boxes), each passed on to the runtime unchanged. Preloaded by scripts/refcounts.sh; prints
// the counts on exit, to stderr. (Calls the runtime makes inside libswiftCore itself do not pass
// through here; those of the executable and the other libraries do.)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef void *(*retain_fn)(void *);
typedef void (*release_fn)(void *);
typedef void *(*retain_n_fn)(void *, uint32_t);
typedef void (*release_n_fn)(void *, uint32_t);
typedef void *(*alloc_fn)(void *, size_t, size_t);

static atomic_ulong retains, releases, string_retains, string_releases, allocations;

// The runtime's function `name`, looked up on first use: libraries' initializers retain before
// this library's own would run. (Threads racing on a first use store the same address.)
static void *resolve(_Atomic(void *) *slot, const char *name) {
    void *found = atomic_load_explicit(slot, memory_order_acquire);
    if (found) return found;
    found = dlsym(RTLD_NEXT, name);
    if (!found) {
        // A binary with the Swift runtime linked in statically has none to interpose.
        fprintf(stderr, "refcounts: %s not found: is the Swift runtime linked dynamically?\n", name);
        abort();
    }
    atomic_store_explicit(slot, found, memory_order_release);
    return found;
}

#define REAL(type, name) \
    static _Atomic(void *) slot; \
    type real = (type)resolve(&slot, name)

static void count(atomic_ulong *counter, unsigned long n) { atomic_fetch_add_explicit(counter, n, memory_order_relaxed); }

void *swift_retain(void *object) {
    REAL(retain_fn, "swift_retain");
    count(&retains, 1);
    return real(object);
}

void swift_release(void *object) {
    REAL(release_fn, "swift_release");
    count(&releases, 1);
    real(object);
}

void *swift_bridgeObjectRetain(void *object) {
    REAL(retain_fn, "swift_bridgeObjectRetain");
    count(&string_retains, 1);
    return real(object);
}

void swift_bridgeObjectRelease(void *object) {
    REAL(release_fn, "swift_bridgeObjectRelease");
    count(&string_releases, 1);
    real(object);
}

void *swift_retain_n(void *object, uint32_t n) {
    REAL(retain_n_fn, "swift_retain_n");
    count(&retains, n);
    return real(object, n);
}

void swift_release_n(void *object, uint32_t n) {
    REAL(release_n_fn, "swift_release_n");
    count(&releases, n);
    real(object, n);
}

void *swift_bridgeObjectRetain_n(void *object, uint32_t n) {
    REAL(retain_n_fn, "swift_bridgeObjectRetain_n");
    count(&string_retains, n);
    return real(object, n);
}

void swift_bridgeObjectRelease_n(void *object, uint32_t n) {
    REAL(release_n_fn, "swift_bridgeObjectRelease_n");
    count(&string_releases, n);
    real(object, n);
}

void *swift_allocObject(void *metadata, size_t size, size_t alignMask) {
    REAL(alloc_fn, "swift_allocObject");
    count(&allocations, 1);
    return real(metadata, size, alignMask);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr,
            "REFCOUNTS retains=%lu releases=%lu string_retains=%lu string_releases=%lu allocations=%lu\n",
            atomic_load(&retains), atomic_load(&releases), atomic_load(&string_retains),
            atomic_load(&string_releases), atomic_load(&allocations));
}
