// IGISDKCORE_API marks what the core exports to the modules that use it. Inside Unreal, UBT
// defines it for this module (dllexport while building IgiSdkCore, dllimport in IgiSdk; on
// Linux and Mac visibility("default"), since UBT hides every other symbol of a module built as a
// shared library). Outside the engine (tests, a static library) it is empty. Every class with a
// member defined in a .cpp and every free function carries it; plain structs whose members are
// all inline (Error, Event, ClientOptions, ...) have nothing to export.
#pragma once

#ifndef IGISDKCORE_API
#define IGISDKCORE_API
#endif

#if defined(_MSC_VER)
// C4251: an exported class holding standard-library members (std::string, std::vector). Both
// sides of the DLL boundary are built by the same compiler and library, as UE itself assumes
// (it disables this warning engine-wide).
#pragma warning(disable : 4251)
#endif
