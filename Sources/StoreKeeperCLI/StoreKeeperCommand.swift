import ArgumentParser

@main
struct StoreKeeperCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "storekeeper",
        abstract: "StoreKeeper: a self-hosted App Store in-app-purchase system.",
        subcommands: [
            ServeCommand.self, MigrateCommand.self, ConfigCommand.self, ReverifyCommand.self, VerifyCommand.self,
            LocalStoreCommand.self, BenchCommand.self, ReconcileCommand.self, SimulateCommand.self, ExtendCommand.self,
            DemoCommand.self, ImportCommand.self, ChaosCommand.self,
        ]
    )
}
