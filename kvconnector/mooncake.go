package kvconnector

func mooncake(map[string]any) (Contract, error) { return push(MooncakeConnector), nil }
