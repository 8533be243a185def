import ArgumentParser
import StoreKeeperServer

@main
struct StoreKeeperCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "storekeeper",
        abstract:
            "StoreKeeper: self-hosted in-app purchases — the App Store, Google Play and web checkout through Stripe; several apps, one delivery path.",
        version: StoreKeeperVersion.description,
        subcommands: [
            ServeCommand.self, MigrateCommand.self, ConfigCommand.self, ReverifyCommand.self, VerifyCommand.self,
            LocalStoreCommand.self, BenchCommand.self, ReconcileCommand.self, SimulateCommand.self, ExtendCommand.self,
            DemoCommand.self, ImportCommand.self, ChaosCommand.self, MCPCommand.self,
        ]
    )
}
