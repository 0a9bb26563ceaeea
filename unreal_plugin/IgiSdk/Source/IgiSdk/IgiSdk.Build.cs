// The Unreal layer: the game-instance subsystem that runs the sidecar, the NPC dialogue
// component, Blueprint async actions, the save game and the FSocket transport.
//
// Packaged games: the sidecar bundle (and a model folder outside it, if ModelDir names one) is
// staged with RuntimeDependencies, at the same path under the project as in the Editor, so the
// subsystem finds it where it looks (FPaths::ProjectDir() + SidecarExecutable): in a staged build
// ProjectDir() is <Stage>/<Project>/ and $(ProjectDir) files are staged there. The folders are
// read from the subsystem's settings in the project's Game config
// ([/Script/IgiSdk.IgiSdkSubsystem] SidecarExecutable, ModelDir); a setting that is absolute or
// leaves the project is not staged (a developer's own sidecar), with a warning.
using System.IO;
using EpicGames.Core;
using Microsoft.Extensions.Logging;
using UnrealBuildTool;

public class IgiSdk : ModuleRules
{
	const string SettingsSection = "/Script/IgiSdk.IgiSdkSubsystem";
	const string DefaultSidecarExecutable = "Binaries/ThirdParty/IgiSdk/igi-sdk";

	public IgiSdk(ReadOnlyTargetRules Target) : base(Target)
	{
		PCHUsage = PCHUsageMode.UseExplicitOrSharedPCHs;
		bEnableExceptions = false;
		bUseRTTI = false;
		PublicDependencyModuleNames.AddRange(new string[] { "Core", "CoreUObject", "Engine", "IgiSdkCore" });
		PrivateDependencyModuleNames.AddRange(new string[] { "Sockets", "Networking", "Projects" });
		StageSidecar(Target);
	}

	void StageSidecar(ReadOnlyTargetRules Target)
	{
		if (Target.ProjectFile == null || Target.Type == TargetType.Program)
		{
			return;  // no project to stage into
		}
		DirectoryReference ProjectDir = Target.ProjectFile.Directory;
		string SidecarExecutable = DefaultSidecarExecutable;
		string ModelDir = "";
		ConfigHierarchy Game = ConfigCache.ReadHierarchy(ConfigHierarchyType.Game, ProjectDir, Target.Platform);
		string Value;
		if (Game.GetString(SettingsSection, "SidecarExecutable", out Value) && !string.IsNullOrWhiteSpace(Value))
		{
			SidecarExecutable = Value.Trim();
		}
		if (Game.GetString(SettingsSection, "ModelDir", out Value) && !string.IsNullOrWhiteSpace(Value))
		{
			ModelDir = Value.Trim();
		}
		// the whole one-folder bundle: the executable, _internal/ and models/
		string BundleDir = Path.GetDirectoryName(SidecarExecutable.Replace('\\', '/')) ?? "";
		StageProjectFolder(ProjectDir, BundleDir, "SidecarExecutable");
		string ModelRelative = ModelDir.Replace('\\', '/').TrimEnd('/');
		if (ModelRelative.Length > 0 && !IsInside(ModelRelative, BundleDir.Replace('\\', '/')))
		{
			StageProjectFolder(ProjectDir, ModelRelative, "ModelDir");
		}
	}

	void StageProjectFolder(DirectoryReference ProjectDir, string Relative, string Setting)
	{
		Relative = Relative.Replace('\\', '/').TrimEnd('/');
		if (Relative.Length == 0 || Path.IsPathRooted(Relative) || Relative == ".." || Relative.StartsWith("../") || Relative.Contains("/../"))
		{
			Logger.LogWarning("IgiSdk: {Setting} is not a folder inside the project ({Path}); it is not staged with the game", Setting, Relative);
			return;
		}
		DirectoryReference Folder = DirectoryReference.Combine(ProjectDir, Relative);
		if (!DirectoryReference.Exists(Folder))
		{
			Logger.LogWarning("IgiSdk: no {Folder} ({Setting}); a packaged game will not find the igi-sdk sidecar", Folder.FullName, Setting);
			return;
		}
		// NonUFS: loose files next to the game (a process cannot be started from the pak)
		RuntimeDependencies.Add("$(ProjectDir)/" + Relative + "/...", StagedFileType.NonUFS);
	}

	static bool IsInside(string Path, string Folder)
	{
		return Folder.Length > 0 && (Path == Folder || Path.StartsWith(Folder + "/"));
	}
}
