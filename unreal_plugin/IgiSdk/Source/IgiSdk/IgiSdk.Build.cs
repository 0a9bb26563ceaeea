// The Unreal layer: the game-instance subsystem that runs the sidecar, the NPC dialogue
// component, Blueprint async actions, the save game and the FSocket transport.
using UnrealBuildTool;

public class IgiSdk : ModuleRules
{
	public IgiSdk(ReadOnlyTargetRules Target) : base(Target)
	{
		PCHUsage = PCHUsageMode.UseExplicitOrSharedPCHs;
		bEnableExceptions = false;
		bUseRTTI = false;
		PublicDependencyModuleNames.AddRange(new string[] { "Core", "CoreUObject", "Engine", "IgiSdkCore" });
		PrivateDependencyModuleNames.AddRange(new string[] { "Sockets", "Networking", "Projects" });
	}
}
