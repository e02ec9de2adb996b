// Counts the reference-count operations a Swift process makes through the dynamic linker:
// swift_retain, swift_release and the string (bridge object) variants, each passed on to the
// runtime unchanged. Preloaded by scripts/refcounts.sh; prints the counts on exit, to stderr.
// (Calls the runtime makes inside libswiftCore itself do not pass through here; the process's
// own code, where the hot path's copies are, does.)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>

static atomic_ulong retains, releases, string_retains, string_releases;

// The runtime's function of the same name, looked up once.
#define FORWARD(type, name) \
    static type real; \
    if (!real) real = (type)dlsym(RTLD_NEXT, name)

typedef void *(*retain_fn)(void *);
typedef void (*release_fn)(void *);

void *swift_retain(void *object) {
    atomic_fetch_add_explicit(&retains, 1, memory_order_relaxed);
    FORWARD(retain_fn, "swift_retain");
    return real(object);
}

void swift_release(void *object) {
    atomic_fetch_add_explicit(&releases, 1, memory_order_relaxed);
    FORWARD(release_fn, "swift_release");
    real(object);
}

void *swift_bridgeObjectRetain(void *object) {
    atomic_fetch_add_explicit(&string_retains, 1, memory_order_relaxed);
    FORWARD(retain_fn, "swift_bridgeObjectRetain");
    return real(object);
}

void swift_bridgeObjectRelease(void *object) {
    atomic_fetch_add_explicit(&string_releases, 1, memory_order_relaxed);
    FORWARD(release_fn, "swift_bridgeObjectRelease");
    real(object);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "REFCOUNTS retains=%lu releases=%lu string_retains=%lu string_releases=%lu\n",
            atomic_load(&retains), atomic_load(&releases), atomic_load(&string_retains),
            atomic_load(&string_releases));
}
