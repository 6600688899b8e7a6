// How the headers' names depend on the build mode: every C++ name of the API lives in an inline
// namespace of `safetensors` named after whether exceptions and RTTI are on.
//
// Why: the headers are inline code, and some of it differs by mode (an error is thrown with
// exceptions and reported by abort without them; `Error`'s vtable has type information only with
// RTTI). A program may build some files with -fno-exceptions or -fno-rtti and others without.
// Were the names the same, the linker would keep one copy of each inline function and vtable for
// the whole program, and a file built with exceptions could end up running the other mode's copy
// (its `catch` would never see the error) or a vtable without type information (`typeid` and
// `dynamic_cast` would crash). With the mode in the name each file gets its own copies, and
// handing a library object from a file of one mode to a file of another fails to link instead of
// misbehaving. Users write `safetensors::SafeOpen` as always; only mangled names change.
#pragma once

// Every public header includes this one first, so an older language mode stops here, with this
// message, instead of deep inside a header at the first C++20 construct.
#if !defined(__cplusplus) || __cplusplus < 202002L
#error "safetensors needs C++20: compile with -std=c++20 (safetensors::safetensors in CMake asks for it)"
#endif

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#if defined(__cpp_rtti) || defined(__GXX_RTTI)
#define SAFETENSORS_ABI abi_eh_rtti
#else
#define SAFETENSORS_ABI abi_eh_nortti
#endif
#else
#if defined(__cpp_rtti) || defined(__GXX_RTTI)
#define SAFETENSORS_ABI abi_noeh_rtti
#else
#define SAFETENSORS_ABI abi_noeh_nortti
#endif
#endif

// `= delete` with its reason in the compiler's message where the compiler supports it (C++26's
// `= delete("reason")`, P2573: GCC 15 and Clang 19 in C++26 mode), a plain `= delete` elsewhere;
// the declaration's comment gives the same reason.
#if defined(__cpp_deleted_function) && __cpp_deleted_function >= 202403L
#define SAFETENSORS_DELETE(reason) delete (reason)
#else
#define SAFETENSORS_DELETE(reason) delete
#endif
