// A shared library that no test program links or loads:
// LoadedLibrary.TakesTheProcesssCopyAndNeverLoadsOneOfItsOwn asks
// lamp::detail::loaded_library() for it, which must leave it unloaded, and
// then loads it itself to see the copy found.
extern "C" int lamp_unloaded_library_marker() {
  return 42;
}
