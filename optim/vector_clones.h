// ONEBIT_VECTOR_CLONES: one clone of a function per vector width (AVX-512, AVX2, the baseline),
// chosen when the library loads (an ifunc), for the optimizers' compute-bound loops — a square
// root and a division per element, which the baseline's 4-wide SSE (or scalar code, where a loop
// does not vectorize) leaves well short of the memory rate. -ffp-contract=off (CMakeLists.txt)
// keeps every clone's arithmetic the scalar rule's, so all give the same bits.
//
// A loop vectorizes only without control flow: the rules are written as selects (both sides
// computed, one kept), never as a conditional store or a load one branch alone makes.
//
// Not under a sanitizer: its runtime is not ready when the loader runs ifunc resolvers
// (ThreadSanitizer crashes there).
#pragma once

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define ONEBIT_VECTOR_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define ONEBIT_VECTOR_CLONES
#endif
#endif
#ifndef ONEBIT_VECTOR_CLONES
#define ONEBIT_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
