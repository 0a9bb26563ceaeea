// The engine-agnostic client (msgpack, ZMTP DEALER, I/O thread). Plain C++17 without
// exceptions or RTTI, Unreal's defaults; the same files build outside the engine
// (tests/cpp). Inside Unreal it talks through FSocket (IgiSdk module), never BSD sockets.
// What IgiSdk uses is exported with IGISDKCORE_API, which UBT defines for this module
// (dllexport/dllimport, visibility("default") on Linux and Mac); Public/IgiSdkCoreApi.h defines
// it empty outside the engine.
using UnrealBuildTool;

public class IgiSdkCore : ModuleRules
{
	public IgiSdkCore(ReadOnlyTargetRules Target) : base(Target)
	{
		PCHUsage = PCHUsageMode.NoPCHs;
		CppStandard = CppStandardVersion.Cpp17;
		bEnableExceptions = false;
		bUseRTTI = false;
		PublicDependencyModuleNames.Add("Core");
		PublicDefinitions.Add("IGI_SDK_NO_BSD_SOCKETS=1");
		PrivateDefinitions.Add("IGI_SDK_UNREAL_MODULE=1");
		// standard headers only: keep Unreal's macros out of the core's translation units
		bUseUnity = false;
	}
}
